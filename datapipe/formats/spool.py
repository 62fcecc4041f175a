"""An append-only, length-framed record log: crash-safe staging for stores that are not (HDF5).

A checkpoint is just a byte offset: after a crash the log is truncated to it, and whatever was
appended later is gone without a trace.
"""
from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from pathlib import Path

from ..records import Record
from .base import _META_LEN, pack_record, unpack_record

_FRAME = struct.Struct("<QH")  # payload length, split-name length


class Spool:
    """Records of any split, appended in order to one file."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._file = open(self.path, "ab")
        self.offset = self._file.tell()

    def truncate(self, offset: int) -> None:
        """Drop everything appended after `offset` (a value `sync` returned)."""
        self._file.truncate(offset)
        self.offset = offset

    def append(self, split: str, record: Record) -> None:
        name, payload = split.encode(), pack_record(record)
        self._file.write(_FRAME.pack(len(payload), len(name)) + name + payload)
        self.offset += _FRAME.size + len(name) + len(payload)

    def sync(self) -> int:
        """Make everything appended durable; return the offset to truncate to after a crash."""
        self._file.flush()
        os.fsync(self._file.fileno())
        return self.offset

    def close(self) -> None:
        self._file.close()

    def __iter__(self) -> Iterator[tuple[str, Record]]:
        self._file.flush()
        with open(self.path, "rb") as fh:
            while header := fh.read(_FRAME.size):
                size, name_len = _FRAME.unpack(header)
                split = fh.read(name_len).decode()
                yield split, unpack_record(fh.read(size))

    def metas(self) -> Iterator[tuple[str, bytes]]:
        """Each record's split and JSON metadata (base.record_meta), in order, its bytes skipped."""
        self._file.flush()
        with open(self.path, "rb") as fh:
            while header := fh.read(_FRAME.size):
                size, name_len = _FRAME.unpack(header)
                split = fh.read(name_len).decode()
                (meta_len,) = _META_LEN.unpack(fh.read(_META_LEN.size))
                yield split, fh.read(meta_len)
                fh.seek(size - _META_LEN.size - meta_len, os.SEEK_CUR)
