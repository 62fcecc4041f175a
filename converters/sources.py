"""Fingerprints of the input files a conversion packed, so that `--resume` notices one rewritten since.

The task list pins each file's name, size and label. A file rewritten with the same size (an edit, a
re-download, `cp -p` over it) kept its old bytes in the finished part while the rest was read new:
a mixed dataset that verifies (issue #34). So the read that packs a file also records its
fingerprint: size, mtime (ns), ctime (ns) and inode from fstat, and the digest of its bytes as its
record would carry them (datapipe.records.record_digest over key, label and the file's bytes). When
the original bytes are stored, and they almost always are, that is the record's own digest, which
packing computes anyway: a fingerprint costs a second fstat and ~100 bytes in the staging folder.

At `--resume` each packed file is statted (the scan has just statted it: its inode is cached) and
one whose size, mtime, ctime and inode are all unchanged is unchanged, without a read. Nothing in
user space sets ctime: a rewrite that keeps the size and the mtime (`cp -p`, `rsync -t`,
`os.utime`) still moves it, and rsync's rename gives a new inode. A file whose stat moved (rewritten,
or only touched, chmod'ed, copied to another disk) is read and digested again: the same digest
means unchanged. An archive member (ImageNet's tars) is statted through its archive (once) and
digested alone. A file read within a second of its last change could change again within the same
timestamp tick, so its ctime is not recorded (-1) and it is always read again (git's "racy clean").
"""
from __future__ import annotations

import os
import time
from collections.abc import Iterable
from typing import Any

from datapipe.image.headers import BadImageError
from datapipe.records import NO_FIELDS, Fields, record_digest

from .inputs import open_input, reading
from .members import Member

RACY_NS = 1_000_000_000
DIGEST_CHARS = 32  # of the record digest's 64 hex digits: plenty to tell a rewrite
NONE = ""  # no fingerprint: the file could not be read, or it is an object in a store (not checked)
StatKey = tuple[int, int, int, int]


def stat_key(st: os.stat_result) -> StatKey:
    """What a rewrite moves: size, mtime and ctime (ns), inode (not the device: a remount changes it)."""
    return st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino


def read_stat(path: str) -> tuple[bytes, os.stat_result]:
    """The bytes of the input `path` and its fstat (an archive member's: its archive's); BadImageError
    for a file that cannot be read (converters.inputs) or that changed while it was read."""
    with reading(path), open_input(path) as fh:
        before = os.fstat(fh.fileno())
        data = fh.read()
        after = os.fstat(fh.fileno())
    if stat_key(before) != stat_key(after):
        raise BadImageError("changed while it was being converted")
    return data, after


def fingerprint(st: os.stat_result, digest: str, now_ns: int | None = None) -> str:
    """The fingerprint of a file read at `now_ns` (wall clock; now by default) whose fstat was `st`
    and whose bytes have the record digest `digest` (record_digest(key, label, its bytes))."""
    size, mtime, ctime, ino = stat_key(st)
    if (time.time_ns() if now_ns is None else now_ns) - ctime < RACY_NS:
        ctime = -1
    return f"{size}:{mtime}:{ctime}:{ino}:{digest[:DIGEST_CHARS]}"


def file_fingerprint(st: os.stat_result | None, key: str, label: int, raw: bytes,
                     stored: tuple[bytes, str] | None = None, fields: Fields = NO_FIELDS) -> str:
    """The fingerprint of the file of record (key, label) read as `raw`, fstat `st` (None: an object
    in a store, NONE). `stored`: the bytes stored for it and their record digest, which is the
    file's own when they are `raw` itself: no second hash."""
    if st is None:
        return NONE
    reused = stored is not None and stored[0] is raw
    return fingerprint(st, stored[1] if reused else record_digest(key, label, raw, fields))  # type: ignore[index]


def changed_files(tasks: Iterable[Any], prints: Iterable[str]) -> list[str]:
    """The paths of the tasks (converters.tasks.Task) whose file no longer matches the fingerprint
    recorded when it was packed, in order; a task without one (NONE) is not checked."""
    archives: dict[str, StatKey | None] = {}
    return [task.path for task, recorded in zip(tasks, prints) if recorded and _changed(task, recorded, archives)]


def name_some(paths: list[str], shown: int = 3) -> str:
    """The first `shown` paths, and how many more."""
    more = f" and {len(paths) - shown} more" if len(paths) > shown else ""
    return ", ".join(paths[:shown]) + more


def _changed(task: Any, recorded: str, archives: dict[str, StatKey | None]) -> bool:
    size, mtime, ctime, ino, digest = recorded.split(":")
    then = (int(size), int(mtime), int(ctime), int(ino))
    path = task.path
    member = isinstance(path, Member)
    if member and path.archive not in archives:  # one stat per archive, not per member
        archives[path.archive] = _stat(path.archive)
    now = archives[path.archive] if member else _stat(path)
    if now == then:
        return False
    if now is None or (not member and now[0] != then[0]):
        return True
    try:
        return _digest(task) != digest
    except (OSError, BadImageError):
        return True


def _stat(path: str) -> StatKey | None:
    try:
        return stat_key(os.stat(path))
    except OSError:
        return None


def _digest(task: Any) -> str:
    """The task's file (or member) as it is now: its record digest, cut as fingerprints keep it."""
    with open_input(task.path) as fh:
        return record_digest(task.key, task.label, fh.read(), task.fields)[:DIGEST_CHARS]
