"""data_wait_pct's clock: how long the device sat idle because the next batch had not arrived.

The loop calls waiting() before it asks the loader for a batch, arrived() when it has it (before
queueing its work), queued() once the step's work is queued, collect() at log lines and read() where
it syncs anyway (epoch ends, checkpoints). On a CPU, compute is synchronous: the host's time blocked
in the loader is idle time. On CUDA the host runs ahead of the GPU, so its waiting says little: the
GPU's idle time is the gap between two CUDA events, one recorded after a step's work and one when
the next batch arrived; the events are read at collect() and read(), never per step.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch


class HostWaitClock:
    """The host's time blocked on the loader (CPU training); `now` is the time source, in seconds."""

    def __init__(self, now: Callable[[], float] = time.perf_counter) -> None:
        self._now = now
        self._origin = self._asked = self._wait = 0.0

    def start(self) -> None:
        """A span of training begins (an epoch, or what is left of it after a resume)."""
        self._origin, self._wait = self._now(), 0.0

    def waiting(self) -> None:
        self._asked = self._now()

    def arrived(self) -> None:
        self._wait += self._now() - self._asked

    def queued(self) -> None:
        """The step's work is queued (compute on a CPU is done by then)."""

    def collect(self) -> None:
        """Fold what was measured so far into the sums (CUDA: reads the events)."""

    def read(self) -> tuple[float, float]:
        """(idle seconds, elapsed seconds) since start() or the last read()."""
        self.collect()
        now = self._now()
        wait, seconds = self._wait, now - self._origin
        self._origin, self._wait = now, 0.0
        return wait, seconds


def _timing_event() -> Any:
    return torch.cuda.Event(enable_timing=True)


class CudaWaitClock(HostWaitClock):
    """The GPU's idle time between a step's work and the next batch's arrival, from CUDA events on
    the current stream. GPU work the loader queues on that stream counts as busy time."""

    def __init__(self, now: Callable[[], float] = time.perf_counter, event: Callable[[], Any] = _timing_event) -> None:
        super().__init__(now)
        self._event = event
        self._done: Any = None  # the event after the last queued work, until the next batch pairs with it
        self._pending: list[tuple[Any, Any]] = []

    def _record(self) -> Any:
        event = self._event()
        event.record()
        return event

    def start(self) -> None:
        super().start()
        self._pending.clear()
        self._done = self._record()  # the wait for the span's first batch is idle time too

    def waiting(self) -> None:
        pass

    def arrived(self) -> None:
        if self._done is not None:
            self._pending.append((self._done, self._record()))
            self._done = None

    def queued(self) -> None:
        self._done = self._record()

    def collect(self) -> None:
        if self._pending:
            self._pending[-1][1].synchronize()  # events complete in order: the last one stands for all
            self._wait += sum(done.elapsed_time(arrived) for done, arrived in self._pending) / 1000
            self._pending.clear()

    def read(self) -> tuple[float, float]:
        self._record().synchronize()  # the work queued so far is done: elapsed time includes it
        return super().read()


def make_clock(device: torch.device) -> HostWaitClock:
    return CudaWaitClock() if device.type == "cuda" else HostWaitClock()
