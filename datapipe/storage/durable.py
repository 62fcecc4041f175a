"""Files a crash leaves whole: the old version or the new one, never half (a run's --out, a
dataset's manifest and record lists).

A temp file in the same folder, under a name of its own (PATH.PID.RANDOM.tmp: two processes
writing the same file never share one), is written, flushed and fsynced, then renamed over the target
and the folder fsynced (the rename itself made durable). Until the rename the previous file stays in
place, so a kill -9 or a full disk mid-write costs only the new version. A full disk (ENOSPC, or
EDQUOT over a quota) is one line naming the folder, the bytes needed and what to do; the partial
temp file is removed.

Files are created beside user paths (a run's --out, a lock beside a destination) with `open_own`:
never through a symbolic link planted at the name, never into a FIFO or device.
"""
from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from ..errors import DiskFull, ExpectedError, is_disk_full


class NotOwnFile(ExpectedError):
    """A path datapipe writes its own file at holds a link, a FIFO, a device or a folder instead."""


_KINDS = ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a folder"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def file_kind(mode: int) -> str:
    """What a non-regular file is, in words ("a FIFO", "a symbolic link", ...), for one-line errors."""
    return next((kind for test, kind in _KINDS if test(mode)), "not a regular file")


def _not_own(path: Path, what: str, kind: str) -> NotOwnFile:
    return NotOwnFile(f"{path} is {kind}, not a plain file: datapipe writes its {what} there and does not write "
                      f"through it; remove it (rm {path}) and run again")


def open_own(path: Path, flags: int, *, what: str = "file", mode: int = 0o644) -> int:
    """os.open(path, flags) for a file datapipe writes beside a user's paths, never following a link
    there (O_NOFOLLOW), never blocking on a FIFO (O_NONBLOCK while opening); anything but a plain file
    of one link at `path` is NotOwnFile naming it and saying to remove it."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY, mode)
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
            raise
        try:
            found = os.lstat(path).st_mode
        except OSError:
            found = stat.S_IFLNK
        raise _not_own(path, what, file_kind(found)) from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink > 1:
        os.close(fd)
        kind = file_kind(info.st_mode) if not stat.S_ISREG(info.st_mode) else f"a file with {info.st_nlink} hard links"
        raise _not_own(path, what, kind)
    os.set_blocking(fd, True)
    return fd


def temp_name(path: Path, stem: str | None = None) -> Path:
    """A temp file's name beside `path`, unique to this process and call: STEM.PID.RANDOM.tmp
    (`stem`: path's name, or another where a reader of the folder would pick the name up)."""
    return path.with_name(f"{stem or path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")


def fsync_file(path: Path) -> None:
    """Make a written file's (or a folder's: a rename in it) data durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_write(path: Path, *, needs: int = 0, advice: str = "free space there and run again",
                 tmp_stem: str | None = None) -> Iterator[BinaryIO]:
    """Write `path` through the yielded binary file; it replaces `path` only when the block ends
    without an error. `needs`: the bytes the file will take (for the disk-full message); `tmp_stem`:
    the temp file's stem where `PATH...tmp` would be picked up by a reader of the folder."""
    tmp = temp_name(path, tmp_stem)
    try:
        fd = open_own(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, what="temporary file", mode=0o666)
        with os.fdopen(fd, "wb") as fh:
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
