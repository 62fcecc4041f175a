"""Run a function in a forked child and bring back its result: keeps obstore out of a process.

obstore's runtime does not survive a fork: a child forked after its parent made one request hangs on
its first (measured: tests/storage). DataLoader and DALI fork their workers from the rank's process,
so that process must never touch obstore itself. Its few remote calls (the manifest, the offsets
file, a shard when it reads without workers) each run in a short-lived forked child instead; the
worker processes, which fork nothing, call obstore directly.
"""
from __future__ import annotations

import multiprocessing
import os
import pickle
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


_FORKS_NOTHING = False


def forks_nothing() -> None:
    """Declare that this process never forks workers (a Ray task's worker process): its remote calls
    then run directly instead of in a forked child each."""
    global _FORKS_NOTHING
    _FORKS_NOTHING = True


def may_fork_workers() -> bool:
    """True in a top-level process (a script, a torchrun rank), which may fork workers later; False
    in a multiprocessing child (DataLoader and DALI workers), which forks nothing, and in a process
    that said so (`forks_nothing`)."""
    return not _FORKS_NOTHING and multiprocessing.parent_process() is None


def call_in_child(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """fn(*args, **kwargs) computed in a forked child; its exception is raised here."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: compute, send, leave without running the parent's exit handlers
        os.close(read_end)
        try:
            outcome: tuple[bool, Any] = (True, fn(*args, **kwargs))
        except BaseException as exc:  # everything goes back to the parent, which raises it
            outcome = (False, exc)
        try:
            blob = pickle.dumps(outcome)
        except Exception as exc:
            blob = pickle.dumps((False, RuntimeError(f"{type(outcome[1]).__name__}: {outcome[1]} ({exc})")))
        with os.fdopen(write_end, "wb") as fh:
            fh.write(blob)
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as fh:
        blob = fh.read()
    _, status = os.waitpid(pid, 0)
    if not blob:
        raise RuntimeError(f"the helper process that calls the object store died (wait status {status})")
    ok, value = pickle.loads(blob)
    if not ok:
        raise value
    return value
