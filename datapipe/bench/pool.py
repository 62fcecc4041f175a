"""backend="ray" in `datapipe bench`: one pipeline row per pool size (`pool_workers`), each with the
trainer process's CPU per image and the bytes of host batches it received per image (meter.py).

Each timed run builds its own loader and closes it after: the pool's actors start during the warm-up
and the clock starts once every one is up, and pools of different sizes never hold the cores at once.
One Ray serves the whole bench (`ray_session`): the one this process is connected to (the CLI joins
RAY_ADDRESS's cluster first), else a local one on 127.0.0.1, which is stopped at the end."""
from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..backends import make_loader
from ..formats.base import Dataset
from .meter import bytes_per_image, received


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

    def __call__(self, repeat: int) -> Iterator[Any]:
        loader = make_loader(self.ds, backend="ray", pool_workers=self.size, num_workers=self.size, **self.settings)
        try:
            loader.pool.wait_up()
            loader.set_epoch(repeat)
            yield from loader
        finally:
            got = received(loader)
            self.total = (self.total[0] + got[0], self.total[1] + got[1])
            loader.close()

    @property
    def bytes_per_image(self) -> float | None:
        return bytes_per_image((0, 0), self.total)
