"""pool_workers="auto": Cachew's policy (Graur et al., USENIX ATC'22): the pool grows while the trainer
waits on data and shrinks when it does not. Per window of batches, the trainer's wait fraction (time
blocked receiving a batch over wall time) and the pool's load (actor-seconds of work over wall time):
above GROW_ABOVE the pool wants one actor more; below CALM_BELOW for CALM_WINDOWS windows running, and
with the rest of the actors able to carry the load with HEADROOM to spare, one fewer (never under 1).
Pure: the clock is injected, and the pool decides whether the cluster has room (ray/pool.py)."""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

WINDOW = 8  # batches a decision looks at
GROW_ABOVE = 0.10  # wait fraction above which the trainer is starved
CALM_BELOW = 0.02  # wait fraction under which the trainer is fed
CALM_WINDOWS = 2  # fed windows running before an actor goes
HEADROOM = 1.25  # the actors left must carry the load this many times over


@dataclass(frozen=True)
class Window:
    wait: float  # fraction of the window's wall time the trainer waited for a batch
    load: float  # actor-seconds of work over the window's wall time (actors kept busy, on average)


class Sizing:
    """Measures the trainer's waits (received) and says which pool size a window calls for (wanted)."""

    def __init__(self, *, window: int = WINDOW, grow_above: float = GROW_ABOVE, calm_below: float = CALM_BELOW,
                 calm_windows: int = CALM_WINDOWS, headroom: float = HEADROOM,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.window, self.grow_above, self.calm_below = window, grow_above, calm_below
        self.calm_windows, self.headroom, self.clock = calm_windows, headroom, clock
        self.last: Window | None = None  # the last window's figures (bench, doctor)
        self.restart()

    def restart(self) -> None:
        """A new iteration: the time since the last one is not the trainer's, and its first window
        (actors starting, the prefetch window filling) is not looked at."""
        self._wait = self._wall = self._busy = 0.0
        self._count, self._since, self._skip, self._calm = 0, None, True, 0

    def received(self, asked: float, busy: float) -> Window | None:
        """One batch received: `asked` the clock when the trainer asked for it, `busy` the actor-seconds
        it took. The window's figures when it closes (the first of an iteration: None)."""
        now = self.clock()
        self._wall += now - (asked if self._since is None else self._since)
        self._wait, self._busy, self._count, self._since = self._wait + now - asked, self._busy + busy, self._count + 1, now
        if self._count < self.window:
            return None
        wait, wall, busy, skip = self._wait, self._wall, self._busy, self._skip
        self._wait = self._wall = self._busy = 0.0
        self._count, self._skip = 0, False
        if skip or wall <= 0:
            return None
        self.last = Window(wait / wall, busy / wall)
        return self.last

    def wanted(self, window: Window, size: int) -> int:
        """The pool size `window` calls for: size + 1 (starved), size - 1 (fed long enough, and the
        others can carry the load), else size."""
        if window.wait > self.grow_above:
            self._calm = 0
            return size + 1
        self._calm = self._calm + 1 if window.wait < self.calm_below else 0
        if self._calm >= self.calm_windows and size > 1 and window.load * self.headroom <= size - 1:
            self._calm = 0
            return size - 1
        return size
