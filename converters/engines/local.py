"""The local engine: one whole shard per task on a fork pool of this machine's cores."""
from __future__ import annotations

import multiprocessing
from collections.abc import Iterator
from typing import Any

from datapipe.storage.isolate import forks_nothing

from ..plan import ShardJob
from ..shards import ShardContext, ShardRecords, Tick, build_shard

POLL_S = 0.2
_COUNTS: Any = None  # shared (files, bytes) counters, inherited by the forked workers


def _worker_init(counts: Any) -> None:
    """Pool worker init: the shared counters, and the mark that lets this worker, which forks
    nothing, call the object store directly (datapipe.storage.isolate)."""
    global _COUNTS
    _COUNTS = counts
    forks_nothing()


def _count(files: int, stored: int) -> None:
    with _COUNTS.get_lock():
        _COUNTS[0] += files
        _COUNTS[1] += stored


def _build(job: ShardJob, ctx: ShardContext) -> ShardRecords:
    return build_shard(job, ctx, _count)


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
        fork = multiprocessing.get_context("fork")
        counts = fork.Array("q", 2)
        reported = [0, 0]
        with fork.Pool(workers, initializer=_worker_init, initargs=(counts,)) as pool:
            pending = [pool.apply_async(_build, (job, ctx)) for job in jobs]
            while pending:
                pending[0].wait(POLL_S)
                with counts.get_lock():
                    now = [counts[0], counts[1]]
                tick(now[0] - reported[0], now[1] - reported[1])
                reported = now
                ready = [r.ready() for r in pending]
                finished = [r for r, done in zip(pending, ready) if done]
                pending = [r for r, done in zip(pending, ready) if not done]
                for result in finished:
                    yield result.get()
