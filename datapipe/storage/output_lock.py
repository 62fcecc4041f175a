"""One writer per output: a lock file naming its holder, held for a whole conversion (`DST.lock`
beside its destination, converters.lock) or training run (`OUT/train.lock`, datapipe.train).

The file holds the holder's host, PID and start time; the holder keeps an exclusive `flock` on it
and touches it every HEARTBEAT_S.
- On this host the kernel's flock decides: it is held while the holder lives and released when it
  dies, however it dies (so a reused PID is never taken for the holder); the file names the holder.
- A lock written by another host (a shared filesystem, where flock may be local to each node) is live
  while it was touched in the last STALE_S, as the shard cache judges other hosts' downloads.
A second writer is refused in one line naming the holder; a dead holder's lock is taken over. The
file is opened without following a link (durable.open_own): a link planted at its path is refused,
never written through. Whoever can write the folder can write the file: at most LOCK_BYTES of it are
read, and each field it names is shown escaped (no control character reaches a terminal) and cut
to FIELD_CHARS.
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

from ..errors import ExpectedError, plain
from .durable import open_own

HEARTBEAT_S = 30.0  # the holder touches its lock this often
STALE_S = 600.0  # another host's lock untouched this long is taken for dead
LOCK_BYTES = 4096  # a lock this process writes is ~100 bytes; a larger file is not read as one
FIELD_CHARS = 64  # a field of a lock shown in a message is cut to this
clock = time.time  # what "now" is when a lock's age is judged (tests inject their own)
log = logging.getLogger(__name__)
_held: set[int] = set()  # descriptors of the locks this process holds


class OutputLocked(ExpectedError):
    """Another live process holds the output's lock; the message names it (host, pid, start)."""


def _close_in_child() -> None:
    """A forked child (a conversion's worker, a loader's) does not hold its parent's lock: the flock
    belongs to the open file, which the child would otherwise keep open after the parent died."""
    for fd in list(_held):
        with contextlib.suppress(OSError):
            os.close(fd)
    _held.clear()


os.register_at_fork(after_in_child=_close_in_child)


def describe(holder: dict) -> str:
    """"host H, pid P, started S", each field as read from a lock file that anyone who can write its
    folder may have written: escaped and cut (errors.plain)."""
    return ", ".join(f"{label} {plain(holder.get(key, '?'), FIELD_CHARS)}"
                     for label, key in (("host", "host"), ("pid", "pid"), ("started", "since")))


def _read(fd: int) -> dict:
    """The lock's fields; {} for a file that is not a small JSON object (too long, not UTF-8, nested
    past the parser's depth)."""
    os.lseek(fd, 0, os.SEEK_SET)
    data = os.read(fd, LOCK_BYTES + 1)
    if len(data) > LOCK_BYTES:
        return {}
    try:
        body = json.loads(data.decode() or "{}")
    except (ValueError, UnicodeDecodeError, RecursionError):
        return {}
    return body if isinstance(body, dict) else {}


def _open_locked(path: Path, what: str) -> tuple[int, bool]:
    """(descriptor of the lock file at `path`, whether this process holds its flock). Retries when
    the file was replaced between open and flock, so the lock held is the one at the path."""
    while True:
        fd = open_own(path, os.O_RDWR | os.O_CREAT, what=what)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return fd, False
        try:
            same = os.fstat(fd).st_ino == os.lstat(path).st_ino
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
    def __init__(self, fd: int) -> None:
        super().__init__(name="datapipe-output-lock", daemon=True)
        self.fd, self.stop = fd, threading.Event()

    def run(self) -> None:
        while not self.stop.wait(HEARTBEAT_S):
            with contextlib.suppress(OSError):
                os.utime(self.fd)  # the open file, not the path: a link planted there later is not followed


@contextlib.contextmanager
def hold(path: Path, *, busy: str, error: type[Exception] = OutputLocked,
         host: str | None = None) -> Iterator[dict]:
    """Hold the one-writer lock file `path` for the block. Another live holder: `error` with
    "{busy} ({holder}): wait for it to finish or stop it; its lock is {path}". A link or other
    non-file at `path`: `error` saying to remove it."""
    host = host or socket.gethostname()
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd, held = _open_locked(path, "lock file")
    except ExpectedError as exc:
        raise error(str(exc)) from None
    try:
        holder = _read(fd)
        if not held or _live_elsewhere(holder, path, host):
            raise error(f"{busy} ({describe(holder)}): wait for it to finish or stop it; its lock is {path}")
        if holder:
            log.warning("taking over the lock %s of a process that is gone (%s)", path, describe(holder))
        mine = {"host": host, "pid": os.getpid(), "since": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(mine).encode(), 0)
        os.fsync(fd)
        _held.add(fd)
        beat = _Heartbeat(fd)
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
