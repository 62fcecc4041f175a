"""backend="ray" in `datapipe bench`: one pipeline row per pool size (`pool_workers`), each with the
trainer process's CPU per image, the pool's (its actors' processes) and the bytes of host batches it
received per image (meter.py).

Each timed run builds its own loader and closes it after: the pool's actors start during the warm-up
and the clock starts once every one is up, and pools of different sizes never hold the cores at once.
The loader is persistent for its one run, so its actors are still there to be asked their CPU time
when the window ends at the epoch's end. Each actor is asked through Ray's `__ray_call__` (a call queued
behind the batches leased to it, so the reading comes after them); a member lost or replaced during the
window leaves the row without a pool figure.
One Ray serves the whole bench (`ray_session`): the one this process is connected to (the CLI joins
RAY_ADDRESS's cluster first), else a local one on 127.0.0.1, which is stopped at the end."""
from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from contextlib import contextmanager
import time
from typing import Any

from ..backends import make_loader
from ..formats.base import Dataset
from .meter import Reading, bytes_per_image, cpu_between, received

READ_S = 120.0  # an actor's CPU reading waits behind the batches leased to it: seconds at most


def ray_installed() -> bool:
    return importlib.util.find_spec("ray") is not None


@contextmanager
def ray_session(needed: bool) -> Iterator[None]:
    """Connected to a Ray for the block when `needed` (and Ray is installed); a Ray started here is
    stopped after it."""
    if not needed or not ray_installed():
        yield
        return
    from ..backends.ray import session

    ray, owned = session.connect()
    try:
        yield
    finally:
        session.shutdown(ray, owned)


class PoolRuns:
    """`make_batches` for suites.timed: run r is epoch r of a fresh backend="ray" loader with `size`
    actors; the bytes it received per image are summed over the runs."""

    def __init__(self, ds: Dataset, size: int, settings: dict[str, Any]) -> None:
        self.ds, self.size, self.settings = ds, size, settings
        self.total = (0, 0)  # bytes, images received over every run
        self.loader: Any = None  # the run's loader

    def __call__(self, repeat: int) -> Iterator[Any]:
        self.loader = make_loader(self.ds, backend="ray", pool_workers=self.size, num_workers=self.size,
                                  persistent_workers=True, **self.settings)
        return _Run(self, self.loader, repeat)

    def cpu_meter(self) -> Any:
        """A meter.PoolMeter: the CPU seconds the run's actors used from now to its stop()."""
        loader = self.loader
        before = _ask_cpu(loader)
        return lambda: cpu_between(_answers(loader, before), _answers(loader, _ask_cpu(loader)))

    @property
    def bytes_per_image(self) -> float | None:
        return bytes_per_image((0, 0), self.total)


class _Run:
    """One run's batches. The loader stays open at the epoch's end, for the window's last reading of
    its actors; close() (suites.timed calls it after the window) counts what it received and stops it."""

    def __init__(self, runs: PoolRuns, loader: Any, repeat: int) -> None:
        self.runs, self.loader, self.batches = runs, loader, self._batches(loader, repeat)

    @staticmethod
    def _batches(loader: Any, repeat: int) -> Iterator[Any]:
        size = loader.pool.size
        up = loader.pool.wait_up()
        if up < size:  # a row named "ray p=8" must time 8 actors
            raise RuntimeError(f"only {up} of the pool's {size} actors started in time"
                               f"{f' ({loader.pool.last_error})' if loader.pool.last_error else ''}")
        loader.set_epoch(repeat)
        yield from loader

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        return next(self.batches)

    def close(self) -> None:
        """Stop the pool; a run whose batches were decoded here (the loader's fallback) is no pool's figure."""
        try:
            self.batches.close()
        finally:
            got = received(self.loader)
            self.runs.total = (self.runs.total[0] + got[0], self.runs.total[1] + got[1])
            fallback, why = getattr(self.loader, "local_batches", 0), self.loader.pool.last_error
            self.loader.close()
        if fallback:
            raise RuntimeError(f"the pool could not run{f' ({why})' if why else ''}: {fallback} batches were "
                               "decoded in this process instead")


def _actor_cpu_s(actor: Any) -> float:
    """Run inside an actor: its process's CPU seconds (all its threads, Ray's own included)."""
    return time.process_time()


def _ask_cpu(loader: Any) -> dict[int, Any] | None:
    """Each pool member's CPU reading, asked (object refs by member); None where Ray cannot run the call."""
    try:
        return {id(m): m.handle.__ray_call__.remote(_actor_cpu_s) for m in loader.pool.members}
    except Exception:  # a Ray without __ray_call__, a pool not shaped so: no pool figure, the row stands
        return None


def _answers(loader: Any, asked: dict[int, Any] | None) -> Reading | None:
    if asked is None:
        return None
    try:
        return dict(zip(asked, loader.ray.get(list(asked.values()), timeout=READ_S)))
    except Exception:  # an actor lost meanwhile, or one not done in READ_S: no pool figure
        return None
