"""Forked worker processes whose death ends the conversion with an error instead of a wait.

multiprocessing.Pool replaces a worker that dies (the out-of-memory killer's SIGKILL) and the task it
held never returns: `convert` waited forever. A ProcessPoolExecutor breaks instead (BrokenProcessPool);
this pool says which task the dead worker held. Each worker keeps the index of the item it works on
in a shared slot; when the pool breaks, the executor stops the other workers with SIGTERM, and their
handler clears their slots first, so the slot still set is the dead worker's.

A worker dies with its driver, even a `kill -9` of it: its results have no reader any more, and a
`.wds` worker would go on writing shards into a staging folder that the next `--resume` or
`--overwrite` uses (issue #34). On Linux the kernel kills it (PR_SET_PDEATHSIG, sent when the
thread that forked it ends: the one that made the pool, which it outlives); elsewhere a thread in
the worker watches the driver. Either way a worker checks the driver before each item, and a
shard worker before it commits a shard (converters.engines.local).
"""
from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from .errors import WorkerDied

IDLE = -1
AHEAD = 2  # tasks per worker submitted ahead of the one the reader waits for
_SLOTS: Any = None  # in a worker: [pid, index of the item in work] per worker, shared
_SLOT = -1  # in a worker: its slot
_DRIVER = -1  # in a worker: the driver's pid
PR_SET_PDEATHSIG = 1  # linux/prctl.h
WATCH_S = 0.5  # how often a worker without PR_SET_PDEATHSIG looks for its driver


def _start(slots: Any, claimed: Any, driver: int, initializer: Callable[..., None] | None, initargs: tuple) -> None:
    """Worker init: die with the driver; claim a slot; leave Ctrl-C to the driver, which stops the
    workers; on SIGTERM (the pool stopping it) clear the slot; then the caller's init."""
    global _SLOTS, _SLOT
    _die_with(driver)
    with claimed.get_lock():
        _SLOT = claimed.value
        claimed.value += 1
    _SLOTS = slots
    slots[2 * _SLOT] = os.getpid()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _stopped)
    if initializer is not None:
        initializer(*initargs)


def _die_with(driver: int) -> None:
    """End this worker when the `driver` process ends (see the module's docstring); at once if it
    already has, between the fork and here."""
    global _DRIVER
    _DRIVER = driver
    if not _kernel_kills_orphans():
        threading.Thread(target=_watch_driver, name="datapipe-driver-watch", daemon=True).start()
    exit_if_orphaned()


def _kernel_kills_orphans() -> bool:
    """Ask Linux to SIGKILL this process when its parent ends; False where it cannot."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, ctypes.c_ulong(signal.SIGKILL), ctypes.c_ulong(0),
                          ctypes.c_ulong(0), ctypes.c_ulong(0)) == 0
    except (OSError, AttributeError):
        return False


def _watch_driver() -> None:
    while True:
        exit_if_orphaned()
        time.sleep(WATCH_S)


def exit_if_orphaned() -> None:
    """In a worker: exit at once when the driver is gone (a no-op anywhere else)."""
    if _DRIVER != -1 and os.getppid() != _DRIVER:
        os._exit(1)  # nothing to clean: the driver that would read our results is gone


def _stopped(signum: int, frame: Any) -> None:
    _SLOTS[2 * _SLOT + 1] = IDLE  # stopped by the pool: not the worker that died
    os._exit(128 + signum)


def _run(fn: Callable[..., Any], first: int, items: Sequence[Any], extra: tuple) -> list[Any]:
    """fn(item, *extra) for each item, the item's index (first + k) in this worker's slot meanwhile."""
    out = []
    try:
        for k, item in enumerate(items):
            exit_if_orphaned()
            _SLOTS[2 * _SLOT + 1] = first + k
            out.append(fn(item, *extra))
    finally:
        _SLOTS[2 * _SLOT + 1] = IDLE
    return out


class WorkerPool:
    """`workers` forked processes (each runs `initializer(*initargs)` first). A worker that dies
    raises WorkerDied naming its item (`describe(index)`) and where the finished part is (`kept`);
    an error in the driver stops the workers at once."""

    def __init__(self, workers: int, describe: Callable[[int], str], kept: str, *,
                 initializer: Callable[..., None] | None = None, initargs: tuple = ()) -> None:
        fork = multiprocessing.get_context("fork")
        self.workers, self.describe, self.kept = workers, describe, kept
        self.slots = fork.RawArray("q", [0, IDLE] * workers)
        self.executor = ProcessPoolExecutor(workers, mp_context=fork, initializer=_start,
                                            initargs=(self.slots, fork.Value("i", 0), os.getpid(), initializer,
                                                      initargs))
        # The first submit forks every worker (a fork pool's rule) in the submitting thread, whose end
        # sends PR_SET_PDEATHSIG: here, by the thread that owns the pool, not by whichever thread
        # first reads a generator of results.
        self.executor.submit(int)

    def submit(self, fn: Callable[..., Any], first: int, items: Sequence[Any], *extra: Any) -> Future:
        """A future of [fn(item, *extra) for item in items], run in a worker; items[k] is item first + k."""
        return self.executor.submit(_run, fn, first, items, extra)

    def map(self, fn: Callable[[Any], Any], items: Sequence[Any], chunk: int) -> Iterator[Any]:
        """fn(item) for every item, in order, `chunk` items a task; only a few tasks a worker run ahead
        of the reader, so results do not pile up in memory when it is the slower side."""
        window: deque[Future] = deque()
        for first in range(0, len(items), chunk):
            window.append(self.submit(fn, first, items[first:first + chunk]))
            if len(window) > AHEAD * self.workers:
                yield from window.popleft().result()
        while window:
            yield from window.popleft().result()

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        broken = isinstance(exc, BrokenProcessPool)
        if exc is not None and not broken:
            self._stop_workers()
        self.executor.shutdown(wait=True, cancel_futures=True)
        if broken:
            raise self._death() from None

    def _stop_workers(self) -> None:
        for pid in self.slots[0::2]:
            if pid > 0:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)

    def _death(self) -> WorkerDied:
        held = [index for index in self.slots[1::2] if index != IDLE]
        doing = f" while {self.describe(min(held))}" if held else ""
        return WorkerDied(f"a worker process died{doing} (killed, e.g. by the out-of-memory killer: see `dmesg`, "
                          f"or crashed); the finished part is kept in {self.kept}: run the same command with "
                          "--resume to finish it")
