"""Checking cached copies against the manifest's sha256: at download, and again on the first open of
each copy in each process, so a copy changed on the disk after its download is never served; and a
local dataset's files against their entries (`datapipe verify`).

Why the sha256 itself and not a cheaper checksum recorded at download: on this project's CPU (SHA-NI),
sha256 reads a page-cached file at ~1.4 GiB/s and zlib's crc32 at ~3 GiB/s (`tools/cache_check_cost.py`,
figures in docs/cache.md): half the cost, for a second digest to store and keep in step with each copy.
"""
from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from pathlib import Path

from tqdm import tqdm

from .dataset_files import BadDatasetFile, open_regular

CHUNK = 1 << 22


def sha256_fd(fd: int) -> str:
    """The sha256 of a whole open file, read with pread (the descriptor's offset is left alone)."""
    h, offset = hashlib.sha256(), 0
    while chunk := os.pread(fd, CHUNK, offset):
        h.update(chunk)
        offset += len(chunk)
    return h.hexdigest()


def sha256_file(path: Path) -> str:
    fd = os.open(path, os.O_RDONLY)
    try:
        return sha256_fd(fd)
    finally:
        os.close(fd)


def file_differs(path: str, size: int, sha256: str | None, what: str = "file") -> str | None:
    """Why the local file `path` (a `what`) is not the one of `size` bytes and `sha256` (when given)
    an entry describes, in a few words; None when it is."""
    try:
        fd = open_regular(path, what=what, fix="re-convert the dataset")
    except FileNotFoundError:
        return "missing"
    except BadDatasetFile as exc:  # a FIFO, a device, a folder: never read
        return exc.kind or exc.reason
    except OSError as exc:
        return f"unreadable ({exc.strerror or exc})"
    try:
        found = os.fstat(fd).st_size
        if found != size:
            return f"{found:,} bytes, not {size:,}"
        return "another sha256" if sha256 and sha256_fd(fd) != sha256 else None
    finally:
        os.close(fd)


def refuse_differing_files(where: str, files: Iterable[tuple[str, str, int, str | None]], *, count: int, total: int,
                           what: str, source: str, progress: bool = False) -> None:
    """Each of `files` (path, name, size, sha256; `count` of them, `total` bytes, a progress bar over
    them) against `file_differs`: ValueError, one line naming the first three that differ (`source`
    gave their entries) and counting the rest; nothing where none does."""
    bad, shown = 0, []
    with tqdm(total=total, desc=f"verify {what}s", unit="B", unit_scale=True, disable=not progress) as bar:
        for path, name, size, sha256 in files:
            why = file_differs(path, size, sha256, what)
            bad += why is not None
            if why and len(shown) < 3:
                shown.append(f"{name}: {why}")
            bar.update(size)
    if bad:
        more = f"; and {bad - len(shown):,} more" if bad > len(shown) else ""
        raise ValueError(f"{where}: {bad:,} of {count:,} {what}s differ from {source}: {'; '.join(shown)}{more}; the "
                         f"{what}s or {source} changed since the conversion: re-convert the dataset")


class CheckedCopies:
    """The cached copies this process has found whole, by path, device and inode: each is hashed once
    per process (a forked or unpickled one starts afresh), and a copy replaced by a new download (a
    new inode) is hashed again."""

    def __init__(self) -> None:
        self._pid, self._seen = os.getpid(), set()

    def __getstate__(self) -> dict:
        return {}

    def __setstate__(self, state: dict) -> None:
        self.__init__()

    def _key(self, path: Path, fd: int) -> tuple[str, int, int]:
        st = os.fstat(fd)
        return str(path), st.st_dev, st.st_ino

    def _current(self) -> set:
        if self._pid != os.getpid():  # no lock: one taken at a fork by another thread would never be let go
            self._pid, self._seen = os.getpid(), set()
        return self._seen

    def whole(self, path: Path, fd: int, sha256: str | None) -> bool:
        """Whether the open copy `fd` of `path` has the manifest's sha256 (True where it gives none:
        the size, checked by the opener, is all there is to check)."""
        if not sha256:
            return True
        key = self._key(path, fd)
        if key in self._current():
            return True
        if sha256_fd(fd) != sha256:
            return False
        self._current().add(key)
        return True

    def add(self, path: Path, fd: int) -> None:
        """Note a copy this process has just downloaded and checked."""
        self._current().add(self._key(path, fd))
