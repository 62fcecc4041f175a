"""HDF5: one file; per split a group of columns: data (vlen uint8), labels, keys, paths, sha256.

The manifest is the file's `datapipe_manifest` attribute, written last. JPEG bytes are stored
uncompressed (they do not compress, and vlen payloads cannot be filtered anyway).
"""
from __future__ import annotations

import functools
import logging
import os
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from ..records import Manifest, Record, Sample
from .base import Dataset, PerProcess, Writer, fsync_file
from .spool import Spool

log = logging.getLogger(__name__)
NAME = "hdf5"
SUFFIXES = (".h5", ".hdf5")
MANIFEST_ATTR = "datapipe_manifest"
SIGNATURE = b"\x89HDF\r\n\x1a\n"
_CHUNK = 256
_BATCH_ROWS = 512
_STR = h5py.string_dtype("utf-8")
_COLUMNS = {
    "data": h5py.vlen_dtype(np.uint8),
    "labels": np.int64,
    "keys": _STR,
    "paths": _STR,
    "sha256": h5py.string_dtype("ascii", 64),
}


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


class _Columns:
    """One process's open split: dataset handles (an h5py name lookup costs more than the read
    itself) and the labels in memory (8 bytes a record)."""

    def __init__(self, path: str, split: str) -> None:
        group = h5py.File(path, "r")[split]
        self.data, self.keys, self.paths, self.sha256 = (group[n] for n in ("data", "keys", "paths", "sha256"))
        self.labels = group["labels"][:]


class Hdf5Dataset(Dataset):
    """Reads one split; the file opens lazily in each process (HDF5 must not cross a fork)."""

    format = NAME

    def __init__(self, path: Path, manifest: Manifest, split: str) -> None:
        super().__init__(path, split=split, classes=manifest.classes, size=manifest.split(split).samples)
        self._columns = PerProcess(functools.partial(_Columns, str(path), split))

    def __getitem__(self, index: int) -> Sample:
        c = self._columns.get()
        index = self._check(index)
        return Sample(c.keys[index].decode(), c.data[index].tobytes(), int(c.labels[index]))

    def _read(self, index: int) -> Record:
        c = self._columns.get()
        return Record(c.keys[index].decode(), c.data[index].tobytes(), int(c.labels[index]),
                      c.paths[index].decode(), c.sha256[index].decode())


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
        with h5py.File(building, "w") as f:
            columns = {split: _create_split(f, split, info.samples) for split, info in manifest.splits.items()}
            filled = {split: 0 for split in columns}
            batch: dict[str, list[Record]] = {}
            for split, record in self._spool:
                rows = batch.setdefault(split, [])
                rows.append(record)
                if len(rows) >= _BATCH_ROWS:
                    filled[split] = _write_rows(columns[split], filled[split], batch.pop(split))
            for split, rows in batch.items():
                filled[split] = _write_rows(columns[split], filled[split], rows)
            f.attrs[MANIFEST_ATTR] = manifest.to_json()
        self._spool.close()
        fsync_file(building)
        os.replace(building, self.payload)

    def abort(self) -> None:
        self._spool.close()


def _create_split(f: h5py.File, split: str, samples: int) -> h5py.Group:
    g = f.create_group(split)
    for name, dtype in _COLUMNS.items():
        g.create_dataset(name, shape=(samples,), dtype=dtype, chunks=(min(_CHUNK, samples),) if samples else None)
    return g


def _write_rows(g: h5py.Group, start: int, rows: list[Record]) -> int:
    """Write rows as slices starting at `start`; return the next free row."""
    end = start + len(rows)
    data = np.empty(len(rows), dtype=object)
    data[:] = [np.frombuffer(r.data, dtype=np.uint8) for r in rows]
    g["data"][start:end] = data
    g["labels"][start:end] = np.array([r.label for r in rows], dtype=np.int64)
    g["keys"][start:end] = np.array([r.key for r in rows], dtype=object)
    g["paths"][start:end] = np.array([r.path for r in rows], dtype=object)
    g["sha256"][start:end] = np.array([r.sha256.encode() for r in rows], dtype="S64")
    return end
