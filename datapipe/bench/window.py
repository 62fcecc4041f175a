"""The timed window every bench figure comes from.

Warm-up batches first (worker start, pipeline build and first-touch IO are not steady state), then the
clock runs until `seconds` pass or the epoch ends, less the epoch's last DRAIN_BATCHES batches; CUDA is
synchronized after every batch. Besides images/s the window reads two CPU clocks: this process's (the
trainer's) and, where the suite gives one, the pool's (the loader's workers: meter.py). `batches` and
`ended` say how much the window held, for the too-short rule (sanity.py)."""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from .meter import PoolMeter, per_image_ms, process_cpu_s

if TYPE_CHECKING:
    from .suites import BenchOptions


class Timing(NamedTuple):
    """One timed run: images/s, % of the time waiting for a batch, this process's CPU ms per image, the
    pool's CPU ms per image (None: not measured), the batches timed, whether the epoch ended the window."""

    images_per_s: float
    wait_pct: float
    cpu_ms_per_image: float
    pool_cpu_ms_per_image: float | None = None
    batches: int | None = None  # None: not counted (a Timing made by hand)
    ended: bool = False


class NoBatchLeft(ValueError):
    """The warm-up used up the epoch: nothing was timed."""


def _cuda_sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _fake_step(ms: float, device: torch.device) -> None:
    """Stand in for a training step of `ms` milliseconds (GPU busy on CUDA, the host waits)."""
    if ms <= 0:
        return
    if device.type == "cuda":
        torch.cuda._sleep(int(ms * 1e-3 * torch.cuda.get_device_properties(device).clock_rate * 1e3))
        torch.cuda.current_stream(device).synchronize()
    else:
        time.sleep(ms / 1000)


# Batches left out at the end of an epoch: a loader that works ahead (DALI's prefetch queue: 2
# batches; the prefetch backend: one batch's copy and normalize) has its last batches ready before
# they are asked for and hands them out without work while it drains, which inflates its rate on a
# short epoch (tests/test_bench.py shows the mechanism). Ending the window before the drain makes
# the look-ahead cancel out: the loader is as far ahead at the window's end as at its start.
DRAIN_BATCHES = 2


def timed(make_batches: Callable[[int], Iterable[Any]], count: Callable[[Any], int], opts: BenchOptions,
          device: torch.device, step: bool = True, clock: Callable[[], float] = time.perf_counter,
          cpu: Callable[[], float] = process_cpu_s, pool: PoolMeter | None = None) -> Callable[[int], Timing]:
    """A run function: warm-up batches, then batches until `seconds` pass or the epoch ends; in
    the second case the window ends DRAIN_BATCHES batches before the end of the epoch. `clock`, `cpu`
    (this process's CPU seconds) and `pool` (started at the window's start, read at its end: the pool's
    CPU seconds, meter.py) are injectable so the window logic is tested without timing anything. The
    batches' iterator is closed at the end (a generator's `finally` runs). NoBatchLeft: nothing to time."""

    def run(repeat: int) -> Timing:
        batches = iter(make_batches(repeat))
        try:
            return window(batches)
        finally:
            getattr(batches, "close", lambda: None)()

    def window(batches: Iterator[Any]) -> Timing:
        for _ in range(opts.warmup):
            next(batches, None)
        _cuda_sync(device)
        stop_pool = pool() if pool is not None else None
        started, cpu0 = clock(), cpu()
        images, waited = 0, 0.0
        marks = [(0.0, 0, 0.0, 0.0)]  # (seconds, images, seconds waited, CPU seconds) after each batch
        ended = False
        while marks[-1][0] < opts.seconds:
            asked = clock()
            batch = next(batches, None)
            waited += clock() - asked
            if batch is None:
                ended = True
                break
            images += count(batch)
            if step:
                _fake_step(opts.simulate_step_ms, device)
            _cuda_sync(device)
            marks.append((clock() - started, images, waited, cpu() - cpu0))
        pool_s = stop_pool() if stop_pool is not None else None  # over every batch received, the drain's too
        pool_ms = per_image_ms(pool_s, images) if pool_s is not None and images else None
        if ended and len(marks) > DRAIN_BATCHES + 1:
            marks = marks[:-DRAIN_BATCHES]
        elapsed, images, waited, cpu_s = marks[-1]
        if images == 0:
            raise NoBatchLeft(f"no batch left after {opts.warmup} warm-up batches: use a larger dataset, "
                              "a smaller --batch-size or --warmup 0")
        return Timing(images / elapsed, 100 * waited / elapsed, per_image_ms(cpu_s, images), pool_ms,
                      len(marks) - 1, ended)

    return run
