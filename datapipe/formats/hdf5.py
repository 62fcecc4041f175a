"""HDF5: one file; per split a group of columns: data (vlen uint8), labels, keys, paths, sha256.

The manifest is the file's `datapipe_manifest` attribute, written last. JPEG bytes are stored
uncompressed (they do not compress, and vlen payloads cannot be filtered anyway).
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from ..records import Manifest, Record
from .base import Dataset, PerProcess, Writer

NAME = "hdf5"
SUFFIXES = (".h5", ".hdf5")
MANIFEST_ATTR = "datapipe_manifest"
SIGNATURE = b"\x89HDF\r\n\x1a\n"
_CHUNK = 256
_FLUSH_ROWS = 512
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


def _open_group(path: str, split: str) -> h5py.Group:
    return h5py.File(path, "r")[split]


class Hdf5Dataset(Dataset):
    """Reads one split; the file opens lazily in each process (HDF5 must not cross a fork)."""

    format = NAME

    def __init__(self, path: Path, manifest: Manifest, split: str) -> None:
        super().__init__(path, split=split, classes=manifest.classes, size=manifest.split(split).samples)
        self._group = PerProcess(functools.partial(_open_group, str(path), split))

    def _read(self, index: int) -> Record:
        g = self._group.get()
        return Record(
            g["keys"][index].decode(), g["data"][index].tobytes(), int(g["labels"][index]),
            g["paths"][index].decode(), g["sha256"][index].decode(),
        )


class Hdf5Writer(Writer):
    """Buffers rows and writes them as slices; a checkpoint flushes the file."""

    def __init__(self, staging: Path, *, size_hint: int, shard_bytes: int) -> None:
        super().__init__(staging, size_hint=size_hint, shard_bytes=shard_bytes)
        self._file = h5py.File(self.payload, "a")
        self._rows: dict[str, list[Record]] = {}

    @property
    def payload(self) -> Path:
        return self.staging / "data.h5"

    def _group(self, split: str) -> h5py.Group:
        if split in self._file:
            return self._file[split]
        g = self._file.create_group(split)
        for name, dtype in _COLUMNS.items():
            g.create_dataset(name, shape=(0,), maxshape=(None,), dtype=dtype, chunks=(_CHUNK,))
        return g

    def write(self, split: str, index: int, record: Record) -> None:
        rows = self._rows.setdefault(split, [])
        rows.append(record)
        if len(rows) >= _FLUSH_ROWS:
            self._flush_rows(split)

    def _flush_rows(self, split: str) -> None:
        rows = self._rows.pop(split, [])
        if not rows:
            return
        g = self._group(split)
        start, end = len(g["labels"]), len(g["labels"]) + len(rows)
        data = np.empty(len(rows), dtype=object)
        data[:] = [np.frombuffer(r.data, dtype=np.uint8) for r in rows]
        columns = {
            "data": data,
            "labels": np.array([r.label for r in rows], dtype=np.int64),
            "keys": np.array([r.key for r in rows], dtype=object),
            "paths": np.array([r.path for r in rows], dtype=object),
            "sha256": np.array([r.sha256.encode() for r in rows], dtype="S64"),
        }
        for name, values in columns.items():
            g[name].resize((end,))
            g[name][start:end] = values

    def checkpoint(self) -> dict[str, Any]:
        for split in list(self._rows):
            self._flush_rows(split)
        self._file.flush()
        return {}

    def restore(self, state: dict[str, Any], counts: dict[str, int]) -> None:
        for split in list(self._file):
            keep = counts.get(split, 0)
            for name in _COLUMNS:
                column = self._file[split][name]
                if len(column) < keep:
                    raise ValueError(f"{self.payload}: split {split!r} holds {len(column)} rows, checkpoint says {keep}")
                column.resize((keep,))

    def close(self, manifest: Manifest) -> None:
        self.checkpoint()
        self._file.attrs[MANIFEST_ATTR] = manifest.to_json()
        self._file.close()

    def abort(self) -> None:
        self._file.close()
