"""One writer per output: a lock file beside a conversion's destination, naming its holder.

`DST.lock` holds the holder's host, PID and start time; the holder keeps an exclusive `flock` on it
and touches it every HEARTBEAT_S.
- On this host the kernel's flock decides: it is held while the holder lives and released when it
  dies, however it dies (so a reused PID is never taken for the holder); the file names the holder.
- A lock written by another host (a shared filesystem, where flock may be local to each node) is live
  while it was touched in the last STALE_S, as the shard cache judges other hosts' downloads.
A second conversion to the same path is refused in one line naming the holder, before it looks at,
resumes or removes (`--overwrite`) the holder's staging folder. A dead holder's lock is taken over.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

from .errors import ConvertError

LOCK_SUFFIX = ".lock"
HEARTBEAT_S = 30.0  # the holder touches its lock this often
STALE_S = 600.0  # another host's lock untouched this long is taken for dead
clock = time.time  # what "now" is when a lock's age is judged (tests inject their own)
log = logging.getLogger(__name__)
_held: set[int] = set()  # descriptors of the locks this process holds


def _close_in_child() -> None:
    """A forked child (a conversion's worker) does not hold its parent's lock: the flock belongs to
    the open file, which the child would otherwise keep open after the parent died."""
    for fd in list(_held):
        with contextlib.suppress(OSError):
            os.close(fd)
    _held.clear()


os.register_at_fork(after_in_child=_close_in_child)


def lock_path(dst: Path) -> Path:
    return dst.with_name(dst.name + LOCK_SUFFIX)


def describe(holder: dict) -> str:
    return f"host {holder.get('host', '?')}, pid {holder.get('pid', '?')}, started {holder.get('since', '?')}"


def _read(fd: int) -> dict:
    os.lseek(fd, 0, os.SEEK_SET)
    try:
        return json.loads(os.read(fd, 65536).decode() or "{}")
    except (ValueError, UnicodeDecodeError):
        return {}


def _open_locked(path: Path) -> tuple[int, bool]:
    """(descriptor of the lock file at `path`, whether this process holds its flock). Retries when
    the file was replaced between open and flock, so the lock held is the one at the path."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return fd, False
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd, True
        os.close(fd)


def _live_elsewhere(holder: dict, path: Path, host: str) -> bool:
    """A holder on another host whose lock was touched in the last STALE_S."""
    if not holder or holder.get("host") == host:
        return False
    return clock() - path.stat().st_mtime < STALE_S


class _Heartbeat(threading.Thread):
    def __init__(self, path: Path) -> None:
        super().__init__(name="datapipe-convert-lock", daemon=True)
        self.path, self.stop = path, threading.Event()

    def run(self) -> None:
        while not self.stop.wait(HEARTBEAT_S):
            with contextlib.suppress(OSError):
                os.utime(self.path)


@contextlib.contextmanager
def writer_lock(dst: Path, *, host: str | None = None) -> Iterator[dict]:
    """Hold the one-writer lock of `dst` for the block; a ConvertError naming the holder when another
    conversion holds it."""
    path, host = lock_path(dst), host or socket.gethostname()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, held = _open_locked(path)
    try:
        holder = _read(fd)
        if not held or _live_elsewhere(holder, path, host):
            raise ConvertError(f"another conversion to {dst} is running ({describe(holder)}): wait for it to "
                               f"finish or stop it; its lock is {path}")
        if holder:
            log.warning("taking over the lock of a conversion to %s that is gone (%s)", dst, describe(holder))
        mine = {"host": host, "pid": os.getpid(), "since": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(mine).encode(), 0)
        os.fsync(fd)
        _held.add(fd)
        beat = _Heartbeat(path)
        beat.start()
        try:
            yield mine
        finally:
            beat.stop.set()
            with contextlib.suppress(FileNotFoundError):
                path.unlink()  # under our flock: a waiter that opened the old file re-opens (_open_locked)
    finally:
        _held.discard(fd)
        os.close(fd)
