"""Which processes may call obstore themselves, and a forked helper for the others.

obstore's runtime does not survive a fork: once a process has made one request, a child forked from
it hangs on its first request, even through a store it creates afresh (measured with obstore 0.12:
tests/storage). A process that only created a store forks safely. So the rule is:

- a process calls obstore directly only when it is known to fork nothing afterwards: a torch
  DataLoader worker (marked by the backend's worker init), a DALI external_source worker (marked
  by the source when it first runs outside the process that made it), a converter pool worker (its
  initializer), a Ray task. Each says so with `forks_nothing()`, which marks that pid only: a
  child forked from it is not marked.
- every other process (a script, a torchrun rank, a rank started by `mp.spawn`, a forkserver or
  Lightning's ddp_spawn, a notebook) may fork workers later, so each of its few remote calls (the
  manifest, a shard when it reads without workers) runs in a short-lived forked
  child (`call_in_child`) and its own runtime never starts.

Having a parent is no evidence either way: a spawned rank has one and forks DataLoader or DALI
workers. The safety net records what a process did: a direct request marks it, every process forked
from it (at any depth) knows it inherited a dead runtime, and a direct call there fails at once with
a message (`direct_call_refused`) instead of hanging forever.
"""
from __future__ import annotations

import os
import pickle
from collections.abc import Callable
from typing import Any, TypeVar

from .redaction import redact

T = TypeVar("T")

_FORKS_NOTHING_PID: int | None = None  # the process that declared it forks nothing
_RUNTIME_PID: int | None = None  # the process whose obstore runtime runs (it made a direct request)
_INHERITED_FROM: int | None = None  # in a process forked after one: that process's pid


def forks_nothing() -> None:
    """Declare that this process never forks (a DataLoader, DALI or converter worker, a Ray task):
    its remote calls then run directly instead of in a forked child each. Only this pid is marked."""
    global _FORKS_NOTHING_PID
    _FORKS_NOTHING_PID = os.getpid()


def may_fork_workers() -> bool:
    """True unless this very process said `forks_nothing`: its obstore calls go to `call_in_child`."""
    return _FORKS_NOTHING_PID != os.getpid()


def direct_call_refused() -> str | None:
    """Why this process must not call obstore (it was forked after a process made requests), or None;
    otherwise notes that this process's runtime now runs, for the children it may fork."""
    global _RUNTIME_PID
    if _INHERITED_FROM is not None:
        return (f"process {os.getpid()} was forked from process {_INHERITED_FROM} after that process had made "
                "object-store requests, and obstore cannot work after such a fork (the request would hang "
                "forever); start this process with 'spawn' or 'forkserver', or make the requests in a "
                "process that forks nothing after them (datapipe.storage.isolate)")
    _RUNTIME_PID = os.getpid()
    return None


def _after_fork_in_child() -> None:
    global _INHERITED_FROM
    if _INHERITED_FROM is None and _RUNTIME_PID is not None:
        _INHERITED_FROM = _RUNTIME_PID


os.register_at_fork(after_in_child=_after_fork_in_child)


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
            blob = pickle.dumps((False, RuntimeError(redact(f"{type(outcome[1]).__name__}: {outcome[1]} ({exc})"))))
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
