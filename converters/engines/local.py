"""The local engine: one whole shard per task on forked workers of this machine's cores
(converters.workers: a worker that dies ends the run naming its shard, instead of a wait)."""
from __future__ import annotations

import multiprocessing
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, wait
from dataclasses import replace
from pathlib import Path
from typing import Any

from datapipe.storage.isolate import forks_nothing

from ..shards import ShardContext, ShardRecords, Tick, build_shard
from ..targets import Target
from ..tasks import ShardJob
from ..workers import WorkerPool, exit_if_orphaned

POLL_S = 0.2
_COUNTS: Any = None  # shared (files, bytes) counters, inherited by the forked workers


def _worker_init(counts: Any) -> None:
    """Worker init: the shared counters, and the mark that lets this worker, which forks
    nothing, call the object store directly (datapipe.storage.isolate)."""
    global _COUNTS
    _COUNTS = counts
    forks_nothing()


def _count(files: int, stored: int) -> None:
    with _COUNTS.get_lock():
        _COUNTS[0] += files
        _COUNTS[1] += stored


class _WhileDriverLives:
    """The shard target, whose commits first make sure the driver is still there: a worker whose
    driver is gone commits no shard into a staging folder a --resume or --overwrite may be using
    (converters.workers: on Linux the kernel has killed it already; elsewhere its watch may be late)."""

    def __init__(self, target: Target) -> None:
        self.target = target

    def __getattr__(self, name: str) -> Any:
        return getattr(self.target, name)

    def commit(self, files: list[Path], record_list: str, text: str) -> None:
        exit_if_orphaned()
        self.target.commit(files, record_list, text)


def _build(job: ShardJob, ctx: ShardContext) -> ShardRecords:
    return build_shard(job, replace(ctx, target=_WhileDriverLives(ctx.target)), _count)


class LocalEngine:
    """Shards built by `workers` processes at once (one in this process when 1); the workers count
    files and bytes in shared memory, so the bar moves per file, not per shard."""

    name = "local"

    def __init__(self, workers: int) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.workers = workers

    def run(self, jobs: list[ShardJob], ctx: ShardContext, tick: Tick) -> Iterator[ShardRecords]:
        workers = min(self.workers, len(jobs))
        if workers <= 1:
            for job in jobs:
                yield build_shard(job, ctx, tick)
            return
        counts = multiprocessing.get_context("fork").Array("q", 2)
        reported = (0, 0)
        with WorkerPool(workers, lambda n: f"building shard {jobs[n].name}", ctx.target.describe(),
                        initializer=_worker_init, initargs=(counts,)) as pool:
            pending = {pool.submit(_build, n, [job], ctx) for n, job in enumerate(jobs)}
            while pending:
                finished, pending = wait(pending, timeout=POLL_S, return_when=FIRST_COMPLETED)
                reported = _report(counts, reported, tick)
                for future in finished:
                    yield future.result()[0]


def _report(counts: Any, reported: tuple[int, int], tick: Tick) -> tuple[int, int]:
    """Tick what the workers counted since `reported`; returns the counts now. Never waits long for
    the lock: a worker killed while it held the lock (the pool reports that death) keeps it forever."""
    lock = counts.get_lock()
    if not lock.acquire(timeout=POLL_S):
        return reported
    try:
        now = (counts[0], counts[1])
    finally:
        lock.release()
    tick(now[0] - reported[0], now[1] - reported[1])
    return now
