"""A node-local cache of whole remote files (shards, indices), shared by every rank and worker.

A file is downloaded under a temporary name (`.NAME.PID.part`), checked against the size and sha256
the manifest gives, and renamed into place: a crash leaves only a `.part`, which never looks whole
and is removed once its process is gone. One download per file per node: a per-file lock
(`fcntl.flock`) makes the other processes wait and then find it. Eviction is least recently used
(a read touches the file's mtime) and keeps the cache under `limit` bytes; a limit too small for the
files in flight is refused at start, with the size it needs.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import time
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .urls import RemoteStore

log = logging.getLogger(__name__)
PREFETCH_THREADS = 2


def default_cache_dir() -> Path:
    """$XDG_CACHE_HOME/datapipe, else ~/.cache/datapipe (the convention pip and torch hub follow)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "datapipe"


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive advisory lock on `path` (created if missing), released on exit or process death."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


class ShardCache:
    """Files of one remote dataset, kept in `root/<hash of its URL>/`; `limit` bytes over all of `root`."""

    def __init__(self, store: RemoteStore, root: Path | None = None, limit: int | None = None) -> None:
        if limit is not None and limit <= 0:
            raise ValueError(f"cache_limit must be a positive number of bytes, got {limit}")
        self.store = store
        self.root = Path(root) if root is not None else default_cache_dir() / "shards"
        self.limit = limit
        self.folder = self.root / hashlib.sha256(store.describe().encode()).hexdigest()[:16]
        self._pool: ThreadPoolExecutor | None = None
        self._pool_pid: int | None = None
        self._pending: set[str] = set()
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_pool": None, "_pool_pid": None, "_pending": set(), "_lock": None}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def require(self, needed: int, why: str) -> None:
        """Refuse a limit smaller than what must fit at once."""
        if self.limit is not None and self.limit < needed:
            raise ValueError(f"cache_limit={self.limit:,} bytes is too small: {why} need {needed:,} bytes at once; "
                             f"give cache_limit >= {needed:,} (or no limit)")

    def cached(self, name: str, size: int | None = None) -> Path | None:
        target = self.folder / name
        try:
            st = target.stat()
        except FileNotFoundError:
            return None
        return target if size is None or st.st_size == size else None

    def fetch(self, name: str, *, size: int | None = None, sha256: str | None = None) -> str:
        """The local path of `name`, downloaded first unless a whole copy is cached (touched: recently used)."""
        target = self.cached(name, size)
        if target is None:
            with locked(self.root / ".locks" / f"{self.folder.name}-{name}.lock"):
                target = self.cached(name, size) or self._download(name, size, sha256)
        now = time.time_ns()  # not os.utime(target): the kernel's coarse clock ties files used ms apart
        os.utime(target, ns=(now, now))
        return str(target)

    def _download(self, name: str, size: int | None, sha256: str | None) -> Path:
        target = self.folder / name
        if target.exists():
            log.warning("cached %s has %d bytes, the manifest says %s: fetching it again", target,
                        target.stat().st_size, size)
            target.unlink()
        if size is None:
            size = self.store.size(name)
        self._make_room(size or 0)
        part = self.folder / f".{name}.{os.getpid()}.part"
        part.parent.mkdir(parents=True, exist_ok=True)
        try:
            got = self.store.download(name, part)
            if size is not None and got != size:
                raise OSError(f"{self.store.describe(name)}: downloaded {got} bytes, the manifest says {size}; "
                              "the store's copy is not the one the manifest describes")
            if sha256 and sha256_file(part) != sha256:
                raise OSError(f"{self.store.describe(name)}: its sha256 differs from the manifest's; "
                              "the store's copy is damaged or was replaced, re-upload or re-convert it")
            os.replace(part, target)
        finally:
            part.unlink(missing_ok=True)
        return target

    def _make_room(self, incoming: int) -> None:
        """Evict least recently used whole files until `incoming` more bytes fit under the limit."""
        if self.limit is None:
            return
        with locked(self.root / ".locks" / "evict.lock"):
            files, total = [], 0
            for path in self.root.glob("*/*"):
                try:
                    st = path.stat()
                except FileNotFoundError:
                    continue
                if path.name.endswith(".part"):
                    pid = path.name.rsplit(".", 2)[-2]
                    if pid.isdigit() and not _alive(int(pid)):
                        path.unlink(missing_ok=True)  # a crashed download
                        continue
                else:
                    files.append((st.st_mtime, st.st_size, path))
                total += st.st_size
            for _, size, path in sorted(files):
                if total + incoming <= self.limit:
                    break
                path.unlink(missing_ok=True)
                total -= size
                log.info("cache: evicted %s (%d bytes) to stay under %d", path, size, self.limit)

    def prefetch(self, items: list[tuple[str, int | None, str | None]]) -> None:
        """Download these (name, size, sha256) in background threads of this process, if not cached."""
        if self._pool_pid != os.getpid():  # first use in this process (a forked child starts afresh)
            self._pool = ThreadPoolExecutor(PREFETCH_THREADS, "datapipe-prefetch")
            self._pool_pid, self._pending, self._lock = os.getpid(), set(), threading.Lock()
        for name, size, sha256 in items:
            with self._lock:
                if name in self._pending or self.cached(name, size) is not None:
                    continue
                self._pending.add(name)
            self._pool.submit(self._prefetch_one, name, size, sha256)

    def drain(self) -> None:
        """Wait for this process's prefetches in flight to finish (or fail)."""
        if self._pool is not None and self._pool_pid == os.getpid():
            self._pool.shutdown(wait=True)
            self._pool, self._pool_pid = None, None

    def _prefetch_one(self, name: str, size: int | None, sha256: str | None) -> None:
        try:
            self.fetch(name, size=size, sha256=sha256)
        except Exception as exc:  # the reader fetches it again and reports the error where it matters
            log.debug("prefetch of %s failed: %s", name, exc)
        finally:
            with self._lock:
                self._pending.discard(name)
