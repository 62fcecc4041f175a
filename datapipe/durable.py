"""Files a crash leaves whole: the old version or the new one, never half (a run's --out, a
dataset's manifest and record lists).

A temp file in the same folder is written, flushed and fsynced, then renamed over the target and
the folder fsynced (the rename itself made durable). Until the rename the previous file stays in
place, so a kill -9 or a full disk mid-write costs only the new version. A full disk (ENOSPC, or
EDQUOT over a quota) is one line naming the folder, the bytes needed and what to do; the partial
temp file is removed.
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from .errors import DiskFull, is_disk_full


def fsync_file(path: Path) -> None:
    """Make a written file's (or a folder's: a rename in it) data durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_write(path: Path, *, needs: int = 0, advice: str = "free space there and run again",
                 tmp: Path | None = None) -> Iterator[BinaryIO]:
    """Write `path` through the yielded binary file; it replaces `path` only when the block ends
    without an error. `needs`: the bytes the file will take (for the disk-full message); `tmp`: the
    temp file's name where `PATH.tmp` would be picked up by a reader of the folder."""
    tmp = tmp or path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        written = tmp.stat().st_size if tmp.exists() else 0
        tmp.unlink(missing_ok=True)
        if isinstance(exc, Exception) and is_disk_full(exc):
            raise disk_full(path, max(needs, written), advice) from None
        raise
    fsync_file(path.parent)


def disk_full(path: Path, needs: int, advice: str) -> DiskFull:
    """The one-line error of a write to `path` that found no room."""
    stat = os.statvfs(path.parent)
    return DiskFull(f"disk full: about {needs:,} bytes needed in {path.parent} to write {path.name}, "
                    f"{stat.f_bavail * stat.f_frsize:,} free; {advice}")


def write_text(path: Path, text: str, *, advice: str = "free space there and run again") -> None:
    """`text` (UTF-8) as the whole content of `path`, atomically."""
    data = text.encode("utf-8")
    with atomic_write(path, needs=len(data), advice=advice) as fh:
        fh.write(data)
