"""Where shard tasks run: `local` (this machine's cores) or `ray` (a Ray cluster, optional extra).

An engine takes the shard jobs and a context and yields each shard's record list as it
finishes; every engine runs the same `converters.shards.build_shard`, so their outputs are identical.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from ..shards import ShardContext, ShardRecords, Tick
from ..tasks import ShardJob

ENGINES = ("local", "ray")


class Engine(Protocol):
    name: str

    def run(self, jobs: list[ShardJob], ctx: ShardContext, tick: Tick) -> Iterator[ShardRecords]:
        """Build every job's shard; yield the record lists in any order; report progress through tick.
        A generator: the driver closes it when it stops early, and closing it stops the work."""
        ...


def make_engine(name: str, *, workers: int, ray_address: str | None = None) -> Engine:
    if name == "ray":
        from .ray import RayEngine

        return RayEngine(ray_address)
    if name == "local":
        from .local import LocalEngine

        return LocalEngine(workers)
    raise ValueError(f"engine must be one of {ENGINES}, got {name!r}")
