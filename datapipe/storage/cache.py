"""One node-wide cache of whole remote files (shards), shared by every rank and worker.

Layout under the root (default: node-local, see `default_cache_dir`):
    .locks/           one lock file per cached name, and evict.lock; lock files are never deleted
    <dataset>/        one folder per dataset URL (a hash of it)
        NAME@KEY      a whole, checked copy; KEY is the manifest's sha256 (else the size)
        .NAME@KEY~HOST~PID.part   a download in flight, preallocated to its full size
NAME is the dataset's name for the file when it is plain (letters, digits, `._-`), else a hash of it:
a name from a crafted manifest never becomes a path outside the dataset's folder (datapipe.names).

Guarantees:
- The root is this user's own: made 0700, refused when another user owns it or could change it
  (cachedir.own_folder), so no one else can plant a copy.
- Nothing half-written or changed is served: a download is checked against the manifest's size and
  sha256, then renamed into place; each process checks a copy's sha256 again the first time it opens
  it (verify.py), and a copy that fails is removed, with a warning naming it, and fetched again. Where
  the manifest gives no sha256 (datasets converted before it did), the size is all that is checked.
  A copy is keyed to the manifest's sha256, so a dataset converted again to the same URL is never
  served from the old copy.
- One download per file per node: the others wait on its lock (polling, up to `wait_s`), then use it.
- The limit counts whole files and the full size of every download in flight, on any host. A
  download reserves its room first, evicting least recently used files that no process has open
  (readers pin a file with a shared flock while they hold it open). When no room can be made, it waits
  for readers to let go, up to `wait_s`, then fails with `CacheFull`: never an overshoot, never a hang.
- A download of a process that died on this host is removed; another host's is left alone until it
  has been untouched for `STALE_PART_S` (a PID means nothing on another host).
- A full disk is a `CacheFull` error naming the folder and the bytes needed, not a bad sample.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ..names import cache_component
from .cachedir import default_cache_dir, own_folder, warn_if_network
from .urls import RemoteStore, StoreError
from .verify import CheckedCopies, sha256_file

log = logging.getLogger(__name__)
PREFETCH_THREADS = 2
STALE_PART_S = 3600.0  # another host's download untouched this long is taken for dead
POLL_S = 0.05
WAIT_S = 1200.0  # longer than a whole request may take (RetryPolicy.request_timeout_s)

__all__ = ["CacheFull", "ShardCache", "default_cache_dir"]


class CacheFull(StoreError):
    """The cache cannot hold a file: its disk is full, or its limit is taken by files in use."""


class StoreMismatch(StoreError, OSError):
    """The store's copy is not the one the manifest describes: the whole dataset is suspect."""


@contextlib.contextmanager
def locked(path: Path, deadline: float | None = None, what: str = "") -> Iterator[None]:
    """An exclusive flock on `path` (created if missing), waited for until `deadline` (monotonic)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (fcntl.LOCK_NB if deadline is not None else 0))
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise CacheFull(f"waited too long for another process {what} ({path}); if none is "
                                    "running, the lock's owner hangs: stop it") from None
                time.sleep(POLL_S)
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


def open_pinned(path: Path, size: int | None = None) -> int | None:
    """A read-only fd of `path` holding a shared flock (the pin eviction respects), or None when the
    file is not there whole (missing, evicted meanwhile, or of another size)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    fcntl.flock(fd, fcntl.LOCK_SH)  # waits while an evictor holds it exclusively
    st = os.fstat(fd)
    try:
        linked = os.stat(path).st_ino == st.st_ino
    except FileNotFoundError:
        linked = False
    if linked and (size is None or st.st_size == size):
        return fd
    os.close(fd)
    return None


def unlink_unless_open(path: Path) -> bool:
    """Remove `path` unless a reader holds it open (pinned); True if it is gone."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return False
    try:
        path.unlink(missing_ok=True)  # still locked: a reader opening it now finds it unlinked
    finally:
        os.close(fd)
    return True


class ShardCache:
    """Files of one remote dataset in `root/<hash of its URL>/`; `limit` bytes over all of `root`."""

    def __init__(self, store: RemoteStore, root: Path | None = None, limit: int | None = None, *,
                 host: str | None = None, wait_s: float = WAIT_S) -> None:
        if limit is not None and limit <= 0:
            raise ValueError(f"cache_limit must be a positive number of bytes, got {limit}")
        self.store = store
        self.root = own_folder(Path(root)) if root is not None else default_cache_dir() / "shards"
        self.limit = limit
        self.host = (host or socket.gethostname()).replace("~", "-").replace("/", "-")
        self.wait_s = wait_s
        self.folder = self.root / hashlib.sha256(store.describe().encode()).hexdigest()[:16]
        warn_if_network(self.root)
        self._pool: ThreadPoolExecutor | None = None
        self._pool_pid: int | None = None
        self._pending: set[str] = set()
        self._lock = threading.Lock()
        self._checked = CheckedCopies()

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

    def path(self, name: str, *, size: int | None = None, sha256: str | None = None) -> Path:
        """Where the copy of `name` with this digest (else size) is kept."""
        key = cache_component(sha256)[:16] if sha256 else f"{int(size)}b" if size is not None else "any"
        return self.folder / f"{cache_component(name)}@{key}"

    def lock_path(self, name: str) -> Path:
        """The lock every process downloading `name` takes (never deleted)."""
        return self.root / ".locks" / f"{self.folder.name}-{cache_component(name)}.lock"

    def open(self, name: str, *, size: int | None = None, sha256: str | None = None,
             wait_s: float | None = None) -> int:
        """A pinned read-only fd of a whole, verified copy of `name`, downloaded first unless cached.
        Close it when done: until then the file is never evicted."""
        target = self.path(name, size=size, sha256=sha256)
        deadline = time.monotonic() + (self.wait_s if wait_s is None else wait_s)
        while True:
            fd = self._open_whole(target, size, sha256, remove=False)
            if fd is None:
                with locked(self.lock_path(name), deadline,
                            f"downloading {self.store.describe(name)}"):
                    fd = self._open_whole(target, size, sha256, remove=True)
                    if fd is None:
                        self._download(name, target, size, sha256, deadline)
                        fd = open_pinned(target, size)
                        if fd is not None:  # the copy just checked: no one else writes it while we hold the lock
                            self._checked.add(target, fd)
            if fd is not None:
                now = time.time_ns()  # recently used; not os.utime(target): the coarse clock ties files
                with contextlib.suppress(FileNotFoundError):
                    os.utime(target, ns=(now, now))
                return fd
            if time.monotonic() > deadline:  # evicted between its download and its opening, every time
                raise CacheFull(f"{target} was evicted as soon as it was downloaded: cache_limit={self.limit:,} "
                                "is too small for the files this node reads at once; raise it")

    def _open_whole(self, target: Path, size: int | None, sha256: str | None, *, remove: bool) -> int | None:
        """A pinned fd of the cached copy if it is there whole and (first time in this process) has the
        manifest's sha256, else None; with `remove` (under the file's lock) a damaged copy is unlinked:
        readers that hold it keep their descriptor, nothing is written into it, its path is freed."""
        fd = open_pinned(target, size)
        if fd is None or self._checked.whole(target, fd, sha256):
            return fd
        damaged = os.fstat(fd).st_ino
        os.close(fd)
        if remove:
            log.warning("cached %s differs from the manifest's sha256 (it changed on the disk after its download): "
                        "removed, fetching it again", target)
            with contextlib.suppress(FileNotFoundError):
                if os.stat(target).st_ino == damaged:  # only this file's lock holder puts a copy there: us
                    target.unlink()
        return None

    def _download(self, name: str, target: Path, size: int | None, sha256: str | None, deadline: float) -> None:
        if target.exists():
            log.warning("cached %s has %d bytes, the manifest says %s: fetching it again", target,
                        target.stat().st_size, size)
            unlink_unless_open(target)
        if size is None:
            size = self.store.size(name) or 0
        part = self.folder / f".{target.name}~{self.host}~{os.getpid()}.part"
        self._reserve(part, size, deadline)
        try:
            got = self.store.download(name, part)
            if got != size:
                raise StoreMismatch(f"{self.store.describe(name)}: downloaded {got} bytes, the manifest says {size}; "
                                    "the store's copy is not the one the manifest describes")
            if sha256 and sha256_file(part) != sha256:
                raise StoreMismatch(f"{self.store.describe(name)}: its sha256 differs from the manifest's; the "
                                    "store's copy is damaged or was replaced, re-upload or re-convert it")
            os.replace(part, target)
        finally:
            part.unlink(missing_ok=True)
        self._drop_other_copies(target)

    def _reserve(self, part: Path, size: int, deadline: float) -> None:
        """Create `part` at its full size once the limit has room for it, waiting for readers to let go."""
        while True:
            with locked(self.root / ".locks" / "evict.lock"):
                room, held = self._make_room(size)
                if room:
                    self._preallocate(part, size)
                    return
            if time.monotonic() > deadline:
                raise CacheFull(f"cache_limit={self.limit:,} bytes has no room for {part.name.split('~')[0][1:]} "
                                f"({size:,} bytes): {held:,} bytes are open in readers or being downloaded; raise "
                                "cache_limit, or use fewer ranks or workers on this node")
            time.sleep(POLL_S)

    def _preallocate(self, part: Path, size: int) -> None:
        part.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            if size:
                os.posix_fallocate(fd, 0, size)
        except OSError as exc:
            part.unlink(missing_ok=True)
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            free = os.statvfs(part.parent)
            raise CacheFull(f"no space left in the cache folder {part.parent} for {part.name.split('~')[0][1:]}: "
                            f"it needs {size:,} bytes, the disk has {free.f_bavail * free.f_frsize:,} free; free "
                            "space there, give cache_dir= a larger disk, or a cache_limit below the free space") from None
        finally:
            os.close(fd)

    def _make_room(self, incoming: int) -> tuple[bool, int]:
        """Evict least recently used files no reader holds until `incoming` more bytes fit under the
        limit (run under evict.lock); (whether they fit, the bytes still held)."""
        files, total = [], 0
        for path, st in self._entries():
            if path.name.endswith(".part"):
                if self._dead_part(path, st):
                    path.unlink(missing_ok=True)
                    continue
            else:
                files.append((st.st_mtime_ns, st.st_size, path))
            total += st.st_size
        if self.limit is None:
            return True, total
        for _, size, path in sorted(files):
            if total + incoming <= self.limit:
                break
            if unlink_unless_open(path):
                total -= size
                log.info("cache: evicted %s (%d bytes) to stay under %d", path, size, self.limit)
        return total + incoming <= self.limit, total

    def _entries(self) -> Iterator[tuple[Path, os.stat_result]]:
        """Every cached file and download in flight under the root: the dataset folders only (never .locks)."""
        for folder in self.root.iterdir() if self.root.is_dir() else ():
            if folder.name.startswith(".") or not folder.is_dir():
                continue
            for path in folder.iterdir():
                with contextlib.suppress(FileNotFoundError):
                    yield path, path.stat()

    def _dead_part(self, path: Path, st: os.stat_result) -> bool:
        """A download whose process is gone: on this host by its PID; on another by its age."""
        _, host, pid = path.name[: -len(".part")].rsplit("~", 2) if path.name.count("~") >= 2 else ("", "", "")
        if host == self.host and pid.isdigit():
            return not _alive(int(pid))
        return time.time() - st.st_mtime > STALE_PART_S

    def _drop_other_copies(self, keep: Path) -> None:
        """Copies of the same file with another digest (an older conversion): removed unless open."""
        for other in self.folder.glob(f"{keep.name.rsplit('@', 1)[0]}@*"):
            if other != keep:
                unlink_unless_open(other)

    def prefetch(self, items: list[tuple[str, int | None, str | None]]) -> None:
        """Download these (name, size, sha256) in background threads of this process, if not cached."""
        if self._pool_pid != os.getpid():  # first use in this process (a forked child starts afresh)
            self._pool = ThreadPoolExecutor(PREFETCH_THREADS, "datapipe-prefetch")
            self._pool_pid, self._pending, self._lock = os.getpid(), set(), threading.Lock()
        for name, size, sha256 in items:
            with self._lock:
                if name in self._pending or self.path(name, size=size, sha256=sha256).exists():
                    continue
                self._pending.add(name)
            self._pool.submit(self._prefetch_one, name, size, sha256)

    def drain(self) -> None:
        """Wait for this process's prefetches in flight to finish (or fail)."""
        if self._pool is not None and self._pool_pid == os.getpid():
            self._pool.shutdown(wait=True)
            self._pool, self._pool_pid = None, None

    def _prefetch_one(self, name: str, size: int | None, sha256: str | None) -> None:
        try:  # a hint: no waiting for room; the reader fetches it again and reports errors where they matter
            os.close(self.open(name, size=size, sha256=sha256, wait_s=0))
        except Exception as exc:
            log.debug("prefetch of %s failed: %s", name, exc)
        finally:
            with self._lock:
                self._pending.discard(name)
