"""One training run per --out: rank 0 holds `OUT/train.lock` (datapipe.storage.output_lock, as a conversion
holds `DST.lock`) from before the checkpoint is read to the end of the run. A second run on the same
folder is refused in one line naming the holder (host, pid); a dead run's lock is taken over. The
other ranks write nothing under --out, so they take no lock."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from ..storage.output_lock import hold
from .ddp import DistEnv

LOCK_NAME = "train.lock"


@contextlib.contextmanager
def out_lock(out: str | Path, env: DistEnv) -> Iterator[None]:
    """Hold --out's lock for the block on rank 0 (OutputLocked when another live run holds it)."""
    if not env.is_main:
        yield
        return
    out = Path(out)
    with hold(out / LOCK_NAME, busy=f"another training run with --out {out} is running"):
        yield
