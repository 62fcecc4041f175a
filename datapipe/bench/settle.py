"""Wait for this process tree to go idle between timed runs.

A loader whose timed window closed mid-epoch still has work in flight: DataLoader workers finish the
batches they were sent (prefetch_factor per worker), DALI fills its prefetch queue. Left alone, that
work runs during the next row's run and slows it, which a verdict would read as an effect of that
row's knob. Measured on the 2-core demo LMDB (batch 32, 1-second windows that end mid-epoch): the
naive baseline's workers went on for 0.25-0.4 s and 0.23-0.27 CPU-seconds, DALI for 0.11 CPU-seconds,
up to 12% of the 2 CPU-seconds of the next row's run. datapipe's dataloader, prefetch and threads
backends left none. Waiting cost 1.4 s in a 35 s `--seconds 2 --repeats 3` run of one dataset.
"""
from __future__ import annotations

import time
from collections.abc import Callable

from .meter import processes_cpu


def tree_cpu_seconds() -> float | None:
    """CPU seconds used by this process and its live descendants (Linux /proc); None where unknown."""
    descendants = processes_cpu()
    return None if descendants is None else time.process_time() + sum(descendants.values())


def settle(*, limit_s: float = 5.0, window_s: float = 0.05, busy_cores: float = 0.2,
           cpu: Callable[[], float | None] = tree_cpu_seconds) -> None:
    """Return once the tree used under `busy_cores` cores over one `window_s`, or after `limit_s`."""
    started, last = time.monotonic(), cpu()
    while last is not None and time.monotonic() - started < limit_s:
        time.sleep(window_s)
        now = cpu()
        if now is None or 0 <= now - last < busy_cores * window_s:
            return
        last = now  # busy, or a child exited (its seconds left the sum): look again
