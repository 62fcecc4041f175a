"""Shard builders that fail on purpose, for the Ray engine's tests. They live in a module imported by
its package path (tests.converters.faults), so Ray's workers can import them by name."""
from __future__ import annotations

import os
from pathlib import Path

from converters.shards import build_shard


def dies_mid_shard_once(job, ctx, tick=None, *, marker: Path, shard: str):
    """A Ray task that kills its own worker process after 3 files of `shard`, the first time only."""
    if job.name != shard or marker.exists():
        return build_shard(job, ctx, tick)
    marker.write_text(str(os.getpid()))
    done = []

    def die_after_three(files, nbytes):
        done.append(files)
        if len(done) == 3:
            os._exit(1)

    return build_shard(job, ctx, die_after_three)


def always_fails(job, ctx, tick=None, *, attempts: Path):
    with open(attempts, "a") as fh:
        fh.write(f"{job.name}\n")
    raise OSError(28, "No space left on device (injected)")
