"""HDF5: one file; per split a group of columns: blob + offsets, labels, keys, paths, sha256.

A split's encoded images lie end to end in one flat uint8 `blob`; record i is
`blob[offsets[i]:offsets[i + 1]]` (`offsets` holds n + 1 int64). The group's `layout` attribute names
that layout ("blob-offsets"). Files written before it existed have no such attribute and hold a vlen
uint8 `data` column instead; they are still read. The vlen layout cost every reader process memory
that grew with the records it read (HDF5 caches the global-heap collections vlen rows live in).

A split whose records carry other fields (records.Fields: caption, JSON metadata, multi-labels) has
a `field_mask` column (uint8, bit k: the record has FIELD_NAMES[k]) and, per field it carries, the
values end to end in `{name}_values` (UTF-8 bytes; int32 class ids for `labels`) with
`{name}_offsets` (n + 1 int64), all contiguous and memory-mapped like `blob` and `offsets`. A split
without fields has none of these (its file is as before).

The manifest is the file's `datapipe_manifest` attribute, written last. JPEG bytes are stored
uncompressed (they do not compress).
"""
from __future__ import annotations

import functools
import json
import logging
import os
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from ..records import FIELD_NAMES, NO_FIELDS, Fields, Manifest, Record, Sample, SplitInfo
from .base import Dataset, DatasetReplaced, Identity, PerProcess, Writer, fsync_file
from .spool import Spool

log = logging.getLogger(__name__)
NAME = "hdf5"
SUFFIXES = (".h5", ".hdf5")
MANIFEST_ATTR = "datapipe_manifest"
SIGNATURE = b"\x89HDF\r\n\x1a\n"
LAYOUT_ATTR = "layout"
BLOB_LAYOUT = "blob-offsets"  # absent attribute: the earlier layout, a vlen uint8 `data` column
_CHUNK = 256
_BATCH_ROWS = 512
_STR = h5py.string_dtype("utf-8")
_COLUMNS = {  # chunked, as in the earlier layout; blob, offsets and labels are contiguous
    "keys": _STR,
    "paths": _STR,
    "sha256": h5py.string_dtype("ascii", 64),
}
# What one reader process lets HDF5 cache, whatever the file's size. No chunk cache (HDF5 2.0 keeps up to
# 8 MiB per chunked dataset; reads are random, so it hardly ever hits) and a fixed 256 KiB metadata
# cache (by default it grows towards 32 MiB under random reads of the keys' heap collections).
_CHUNK_CACHE_BYTES = 0
_METADATA_CACHE_BYTES = 256 << 10
MASK = "field_mask"
_VALUE_DTYPES = {"text": np.uint8, "meta": np.uint8, "labels": np.int32}


def is_hdf5(path: Path) -> bool:
    try:
        with open(path, "rb") as fh:
            return fh.read(len(SIGNATURE)) == SIGNATURE
    except OSError:
        return False


def read_manifest(path: Path) -> Manifest | None:
    """The manifest attribute of an HDF5 file, or None when it is not a (complete) datapipe file."""
    path = Path(path)
    if not path.is_file() or not is_hdf5(path):
        return None
    with h5py.File(path, "r") as f:
        text = f.attrs.get(MANIFEST_ATTR)
    return None if text is None else Manifest.from_json(str(text), source=f"{path}:{MANIFEST_ATTR}")


def _open(path: str) -> h5py.File:
    """The file opened for reading with bounded caches (see _METADATA_CACHE_BYTES)."""
    f = h5py.File(path, "r", rdcc_nbytes=_CHUNK_CACHE_BYTES)
    config = f.id.get_mdc_config()
    config.set_initial_size = True
    config.initial_size = config.min_size = config.max_size = _METADATA_CACHE_BYTES
    config.incr_mode = config.flash_incr_mode = config.decr_mode = 0  # H5C_*__off: a fixed size
    f.id.set_mdc_config(config)
    return f


def _split_layout(path: Path | str, group: h5py.Group) -> str:
    """The layout a split's group declares: BLOB_LAYOUT, or "vlen" for a file written before the
    attribute existed (it must then hold the vlen `data` column). Anything else is refused."""
    layout = group.attrs.get(LAYOUT_ATTR)
    if layout is None:
        if "data" not in group:
            raise ValueError(f"{path}: split {group.name.strip('/')!r} has neither a {LAYOUT_ATTR!r} attribute "
                             "nor a 'data' column; the file is damaged, re-convert it")
        return "vlen"
    layout = layout.decode() if isinstance(layout, bytes) else str(layout)
    if layout != BLOB_LAYOUT:
        raise ValueError(f"{path}: split {group.name.strip('/')!r} has layout {layout!r}; this datapipe reads "
                         f"{BLOB_LAYOUT!r} and the earlier vlen layout. Install the newer datapipe that wrote it, "
                         "or re-convert the dataset with this one")
    return layout


def mapped_column(f: h5py.File, column: h5py.Dataset) -> np.ndarray | h5py.Dataset:
    """A contiguous, unfiltered 1-D column memory-mapped from the file `f` has open (its pages are the
    page cache, shared by every process: no private byte per record); any other column as its h5py
    handle, read one row per access."""
    offset = column.id.get_offset()
    if column.chunks is not None or column.compression or offset is None or column.ndim != 1 or not len(column):
        return column
    with os.fdopen(os.dup(f.id.get_vfd_handle()), "rb") as fh:  # the file h5py opened, not the path again
        return np.memmap(fh, dtype=column.dtype, mode="r", offset=offset, shape=column.shape)


class _Columns:
    """One process's open split: dataset handles (an h5py name lookup costs more than the read
    itself); the blob, the labels and the offsets memory-mapped (mapped_column: reads are copies out
    of the page cache, ~1.3x h5py's slicing). Keys, paths and digests are read per access, through
    caches of a fixed size."""

    def __init__(self, path: str, split: str, layout: str, identity: Identity) -> None:
        f = _open(path)
        try:
            identity.check()  # after the open: the file opened is the one the manifest describes
        except DatasetReplaced:
            f.close()
            raise
        group = f[split]
        self.keys, self.paths, self.sha256 = (group[n] for n in ("keys", "paths", "sha256"))
        self.labels = mapped_column(f, group["labels"])
        if layout == BLOB_LAYOUT:
            self.blob, self.offsets = mapped_column(f, group["blob"]), mapped_column(f, group["offsets"])
            self.data = self._from_blob
        else:
            self.vlen = group["data"]
            self.data = self._from_vlen
        self.mask = mapped_column(f, group[MASK]) if MASK in group else None
        self.ragged = {name: (mapped_column(f, group[f"{name}_values"]), mapped_column(f, group[f"{name}_offsets"]))
                       for name in FIELD_NAMES if f"{name}_offsets" in group}

    def fields(self, index: int) -> Fields:
        """Record `index`'s other fields, read from the mapped columns (nothing when the split has none)."""
        bits = 0 if self.mask is None else int(self.mask[index])
        if not bits:
            return NO_FIELDS
        values: list[Any] = []
        for k, name in enumerate(FIELD_NAMES):
            if not bits >> k & 1:
                values.append(None)
                continue
            if name not in self.ragged:
                raise ValueError(f"record {index} has a {name!r} field but its split has no {name}_values column; "
                                 "the file is damaged, re-convert it")
            column, offsets = self.ragged[name]
            raw = np.asarray(column[int(offsets[index]):int(offsets[index + 1])])
            values.append(tuple(raw.tolist()) if name == "labels" else raw.tobytes().decode("utf-8"))
        return Fields(*values)

    def _from_blob(self, index: int) -> bytes:
        return self.blob[self.offsets[index]:self.offsets[index + 1]].tobytes()

    def _from_vlen(self, index: int) -> bytes:
        return self.vlen[index].tobytes()


class Hdf5Dataset(Dataset):
    """Reads one split; the file opens lazily in each process (HDF5 must not cross a fork)."""

    format = NAME

    def __init__(self, path: Path, manifest: Manifest, split: str) -> None:
        super().__init__(path, split=split, classes=manifest.classes, size=manifest.split(split).samples)
        self.identity = Identity.take(path, path, manifest, read_manifest)
        self.fingerprint = manifest.content_digest(split)
        self.fields = tuple(manifest.split(split).fields)
        with h5py.File(path, "r") as f:  # closed again before any fork; says now if the layout is unknown
            layout = _split_layout(path, f[split])
        self._columns = PerProcess(functools.partial(_Columns, str(path), split, layout, self.identity))

    def __getitem__(self, index: int) -> Sample:
        c = self._columns.get()
        index = self._check(index)
        return Sample(c.keys[index].decode(), c.data(index), int(c.labels[index]))

    def _read(self, index: int) -> Record:
        c = self._columns.get()
        return Record(c.keys[index].decode(), c.data(index), int(c.labels[index]),
                      c.paths[index].decode(), c.sha256[index].decode(), c.fields(index))


class Hdf5Writer(Writer):
    """Spools records during the conversion and builds the HDF5 file in one pass at the end.

    HDF5 is not crash-safe: writes after a flush can rewrite the global-heap collections that
    already-flushed vlen rows point into, so a killed writer can leave a file whose old rows are
    damaged. The append-only spool gives exact resume points instead; it costs one more sequential
    write and read of the data, and twice the output's size in free disk while converting.
    """

    def __init__(self, staging: Path, *, size_hint: int, shard_bytes: int) -> None:
        super().__init__(staging, size_hint=size_hint, shard_bytes=shard_bytes)
        self._spool = Spool(self.staging / "records.spool")

    @property
    def payload(self) -> Path:
        return self.staging / "data.h5"

    def write(self, split: str, index: int, record: Record) -> None:
        self._spool.append(split, record)

    def checkpoint(self) -> dict[str, Any]:
        return {"spool_bytes": self._spool.sync()}

    def restore(self, state: dict[str, Any], counts: dict[str, int]) -> None:
        self._spool.truncate(state.get("spool_bytes", 0))

    def close(self, manifest: Manifest) -> None:
        """Build the file under a temporary name, make it durable, rename it into place. The spool
        stays (it is removed with the staging folder once published), so a kill at any moment
        before that leaves something `--resume` can finish."""
        log.info("building %s from the spooled records", self.payload)
        building = self.payload.with_name(self.payload.name + ".building")
        building.unlink(missing_ok=True)
        sizes = self._field_sizes() if any(info.fields for info in manifest.splits.values()) else {}
        with h5py.File(building, "w") as f:
            columns = {split: _SplitBuilder(f, split, info, sizes.get(split))
                       for split, info in manifest.splits.items()}
            batch: dict[str, list[Record]] = {}
            for split, record in self._spool:
                rows = batch.setdefault(split, [])
                rows.append(record)
                if len(rows) >= _BATCH_ROWS:
                    columns[split].write(batch.pop(split))
            for split, rows in batch.items():
                columns[split].write(rows)
            for builder in columns.values():
                builder.check_full()
            f.attrs[MANIFEST_ATTR] = manifest.to_json()
        self._spool.close()
        fsync_file(building)
        os.replace(building, self.payload)

    def _field_sizes(self) -> dict[str, dict[str, int]]:
        """Per split, the length of each field's values column: one pass over the spool's record
        metadata (the image bytes skipped), so the columns are contiguous, sized before they are filled."""
        sizes: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(FIELD_NAMES, 0))
        for split, meta in self._spool.metas():
            fields = Fields.from_json(json.loads(meta).get("fields"))
            for name, value in zip(FIELD_NAMES, fields):
                sizes[split][name] += len(_encoded(name, value))
        return sizes

    def abort(self) -> None:
        self._spool.close()


def _encoded(name: str, value: Any) -> np.ndarray:
    """A field's value as stored in its `{name}_values` column (None, a record without it: nothing)."""
    if value is None:
        return np.zeros(0, dtype=_VALUE_DTYPES[name])
    if name == "labels":
        return np.asarray(value, dtype=_VALUE_DTYPES[name])
    return np.frombuffer(value.encode("utf-8"), dtype=np.uint8)


class _SplitBuilder:
    """One split's group in the file being built, filled in record order: the bytes end to end in a
    contiguous `blob` sized from the manifest (read later without a chunk index or chunk cache),
    `offsets` (n + 1 entries), contiguous `labels`, chunked keys, paths and digests; the other fields'
    columns when the split has some (`sizes`: each one's values length, Hdf5Writer._field_sizes)."""

    def __init__(self, f: h5py.File, split: str, info: SplitInfo, sizes: dict[str, int] | None = None) -> None:
        self.split, self.expected, self.rows, self.bytes = split, info, 0, 0
        g = self.group = f.create_group(split)
        g.attrs[LAYOUT_ATTR] = BLOB_LAYOUT
        g.create_dataset("blob", shape=(info.bytes,), dtype=np.uint8, fill_time="never")
        g.create_dataset("offsets", shape=(info.samples + 1,), dtype=np.int64)
        g["offsets"][0] = 0
        g.create_dataset("labels", shape=(info.samples,), dtype=np.int64)
        for name, dtype in _COLUMNS.items():
            g.create_dataset(name, shape=(info.samples,), dtype=dtype,
                             chunks=(min(_CHUNK, info.samples),) if info.samples else None)
        self.fields = _FieldColumns(g, info, sizes or {}) if info.fields else None

    def write(self, rows: list[Record]) -> None:
        """Append rows after the ones already written."""
        g, start, end = self.group, self.rows, self.rows + len(rows)
        sizes = np.fromiter((len(r.data) for r in rows), dtype=np.int64, count=len(rows))
        ends = self.bytes + np.cumsum(sizes)
        if end > self.expected.samples or ends[-1] > self.expected.bytes:
            raise self._mismatch(f"more than {self.expected.samples} records or {self.expected.bytes} bytes")
        g["blob"][self.bytes:ends[-1]] = np.frombuffer(b"".join(r.data for r in rows), dtype=np.uint8)
        g["offsets"][start + 1:end + 1] = ends
        g["labels"][start:end] = np.array([r.label for r in rows], dtype=np.int64)
        g["keys"][start:end] = np.array([r.key for r in rows], dtype=object)
        g["paths"][start:end] = np.array([r.path for r in rows], dtype=object)
        g["sha256"][start:end] = np.array([r.sha256.encode() for r in rows], dtype="S64")
        if self.fields is not None:
            self.fields.write(start, rows, self._mismatch)
        elif any(r.fields for r in rows):
            raise self._mismatch("records with fields (text, meta, labels) the manifest does not list")
        self.rows, self.bytes = end, int(ends[-1])

    def check_full(self) -> None:
        """Every record the manifest counts was written, and nothing more."""
        if (self.rows, self.bytes) != (self.expected.samples, self.expected.bytes):
            raise self._mismatch(f"{self.rows} records of {self.bytes} bytes")
        if self.fields is not None:
            self.fields.check_full(self._mismatch)

    def _mismatch(self, spooled: str) -> ValueError:
        return ValueError(f"split {self.split!r}: the spool holds {spooled}, the manifest says "
                          f"{self.expected.samples} records of {self.expected.bytes} bytes; the staging folder "
                          "is inconsistent, convert again with --overwrite")


class _FieldColumns:
    """A split's other fields in the file being built: `field_mask` and, per field the split carries,
    its contiguous `{name}_values` (sized beforehand) and `{name}_offsets`, filled in record order."""

    def __init__(self, g: h5py.Group, info: SplitInfo, sizes: dict[str, int]) -> None:
        self.group, self.sizes = g, {name: sizes.get(name, 0) for name in info.fields}
        self.ends = dict.fromkeys(self.sizes, 0)
        g.create_dataset(MASK, shape=(info.samples,), dtype=np.uint8)
        for name, size in self.sizes.items():
            g.create_dataset(f"{name}_values", shape=(size,), dtype=_VALUE_DTYPES[name], fill_time="never")
            g.create_dataset(f"{name}_offsets", shape=(info.samples + 1,), dtype=np.int64)
            g[f"{name}_offsets"][0] = 0

    def write(self, start: int, rows: list[Record], mismatch: Callable[[str], ValueError]) -> None:
        """Each row's mask bits and values, after the `start` rows already written."""
        g, end = self.group, start + len(rows)
        masks = [sum(1 << k for k, v in enumerate(r.fields) if v is not None) for r in rows]
        extra = {name for r in rows for name, v in zip(FIELD_NAMES, r.fields) if v is not None} - self.sizes.keys()
        if extra:
            raise mismatch(f"records with a {sorted(extra)[0]!r} field the manifest does not list")
        g[MASK][start:end] = np.array(masks, dtype=np.uint8)
        for name in self.sizes:
            parts = [_encoded(name, getattr(r.fields, name)) for r in rows]
            ends = self.ends[name] + np.cumsum([len(p) for p in parts], dtype=np.int64)
            if ends[-1] > self.sizes[name]:
                raise mismatch(f"more than {self.sizes[name]} {name} values")
            if ends[-1] > self.ends[name]:
                g[f"{name}_values"][self.ends[name]:ends[-1]] = np.concatenate(parts)
            g[f"{name}_offsets"][start + 1:end + 1] = ends
            self.ends[name] = int(ends[-1])

    def check_full(self, mismatch: Callable[[str], ValueError]) -> None:
        if self.ends != self.sizes:
            raise mismatch(f"field values of lengths {self.ends}, not {self.sizes}")
