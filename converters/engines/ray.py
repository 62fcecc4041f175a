"""The Ray engine: every shard job is one Ray task running `build_shard`, anywhere in the cluster.

Install with `pip install 'datapipe[ray]'` on every node. Tasks read the source and write the
destination themselves, so both must be reachable from every node: a filesystem every node mounts,
or an object-store URL as the destination. A task that fails (its worker died, the disk or the store
failed) is retried `max_retries` times, each attempt building the whole shard again into a fresh
scratch folder; then the run stops, naming the shard. The driver only lists the tasks, cuts the
shards and merges record lists.
"""
from __future__ import annotations

import itertools
import logging
import os
from collections.abc import Callable, Iterator
from typing import Any

from datapipe.ray_local import start_local, stop_local
from datapipe.ray_setup import import_ray, join
from datapipe.storage.isolate import forks_nothing

from ..errors import ConvertError, ShardFailed
from ..shards import ShardContext, ShardRecords, Tick, build_shard
from ..tasks import ShardJob

log = logging.getLogger(__name__)
MAX_RETRIES = 3
POLL_S = 0.5
MIN_WINDOW = 16
STOP_WAIT_S = 30.0


def _build(build: Callable[[ShardJob, ShardContext], ShardRecords], job: ShardJob, ctx: ShardContext) -> ShardRecords:
    """What a Ray task runs (Ray wants a plain function; `build` may be a partial). Our tasks fork
    nothing, so their object-store calls need no forked helper (datapipe.storage.isolate)."""
    forks_nothing()
    return build(job, ctx)


def _stop(ray: Any, refs: list[Any]) -> None:
    """Kill the tasks still running and wait until they are gone, so none writes after the driver
    has given up (and, after --strict, removed the output)."""
    for ref in refs:
        ray.cancel(ref, force=True)
    ray.wait(refs, num_returns=len(refs), timeout=STOP_WAIT_S)


def connect(address: str | None) -> tuple[Any, bool]:
    """(the ray module, whether this call connected it). A Ray this process is connected to is used as
    it is; else the cluster at `address` ("auto": the one `ray start` runs here), or RAY_ADDRESS's,
    joined once probed (ray_setup.join: one line within JOIN_TIMEOUT_S where none answers); with
    neither, a local Ray for this conversion, on 127.0.0.1 only (ray_local.start_local)."""
    ray = import_ray("--engine ray")
    if ray.is_initialized():
        return ray, False
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        join(ray, address, include_dashboard=False, log_to_driver=True)
    else:
        start_local(ray)
    return ray, True


class RayEngine:
    """Shard tasks on the Ray cluster this process is connected to, or on the one at `address`
    ("auto", HOST:PORT) or RAY_ADDRESS; with none, on a local Ray (127.0.0.1 only) started for this
    conversion and stopped after."""

    name = "ray"

    def __init__(self, address: str | None = None, *, max_retries: int = MAX_RETRIES,
                 build: Callable[[ShardJob, ShardContext], ShardRecords] = build_shard) -> None:
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        self.address, self.max_retries, self.build = address, max_retries, build

    def run(self, jobs: list[ShardJob], ctx: ShardContext, tick: Tick) -> Iterator[ShardRecords]:
        if not jobs:
            return
        ray, owned = connect(self.address)
        try:
            yield from self._run(ray, jobs, ctx, tick)
        finally:
            if owned:
                stop_local(ray)  # a local Ray and its folder; a joined cluster: disconnected (it runs on)
                if ray.is_initialized():
                    ray.shutdown()

    def _run(self, ray: Any, jobs: list[ShardJob], ctx: ShardContext, tick: Tick) -> Iterator[ShardRecords]:
        task = ray.remote(num_cpus=1, max_retries=self.max_retries,
                          retry_exceptions=[OSError, ShardFailed])(_build)
        shared, build = ray.put(ctx), ray.put(self.build)
        cpus = int(ray.cluster_resources().get("CPU", 1))
        window = max(MIN_WINDOW, 2 * cpus)  # tasks in flight: every CPU busy, the rest not yet in Ray's store
        waiting, running = iter(jobs), {}

        def submit() -> None:
            for job in itertools.islice(waiting, window - len(running)):
                running[task.remote(build, job, shared)] = job

        submit()
        log.info("%d shard tasks for %d CPUs in the Ray cluster, %d in flight at a time", len(jobs), cpus, window)
        while running:
            ready, _ = ray.wait(list(running), num_returns=1, timeout=POLL_S)
            for ref in ready:
                job = running.pop(ref)
                try:
                    records = ray.get(ref)
                except Exception as exc:
                    _stop(ray, list(running))
                    raise self._failure(job, exc) from None
                tick(records.processed, records.data_bytes)
                submit()
                yield records

    def _failure(self, job: ShardJob, exc: Exception) -> Exception:
        """The error that stops the run: a task's own error as it was raised (it names the shard and
        the file), or, for a task Ray could not finish, one naming the shard and its files."""
        cause = getattr(exc, "cause", None)
        if isinstance(cause, (ConvertError, OSError)):
            return cause
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return ShardFailed(f"shard {job.name} ({len(job.tasks)} files, the first {job.tasks[0].path}) failed "
                           f"{self.max_retries + 1} times on Ray ({type(exc).__name__}: {first}); what finished is "
                           "kept: `--resume` builds the rest")
