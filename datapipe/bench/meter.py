"""What a loader costs the process that trains, beside images/s: its CPU time per image and, for
backend="ray", the bytes of the host batches it received per image (what the network carries).

CPU is time.process_time(): this process and its threads (decode threads, DALI's, the trainer's own
loop), not its worker processes nor a Ray pool's actors, which run elsewhere. Shared by the bench's
timed windows (suites.timed) and tools/bench_ray_pool.py (epoch_usage)."""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

process_cpu_s = time.process_time  # the CPU clock of every trainer figure


def per_image_ms(cpu_s: float, images: int) -> float:
    return 1000 * cpu_s / images if images else 0.0


def received(loader: Any) -> tuple[int, int]:
    """(bytes, images) of the host batches `loader` has received from a pool so far; (0, 0) for a
    loader that decodes in its own processes."""
    return getattr(loader, "received_bytes", 0), getattr(loader, "received_images", 0)


def bytes_per_image(before: tuple[int, int], after: tuple[int, int]) -> float | None:
    """Bytes per image received between two `received` readings (None: nothing received)."""
    images = after[1] - before[1]
    return (after[0] - before[0]) / images if images > 0 else None


@dataclass(frozen=True)
class Usage:
    """One measured stretch of batches: images, wall and process CPU seconds, bytes received per image."""

    images: int
    wall_s: float
    cpu_s: float
    bytes_per_image: float | None = None

    @property
    def images_per_s(self) -> float:
        return self.images / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def trainer_cpu_ms_per_image(self) -> float:
        return per_image_ms(self.cpu_s, self.images)

    def as_dict(self) -> dict[str, float | None]:
        return asdict(self) | {"images_per_s": self.images_per_s,
                               "trainer_cpu_ms_per_image": self.trainer_cpu_ms_per_image}


def epoch_usage(loader: Any, epoch: int) -> Usage:
    """One whole epoch of `loader`, measured (iterated to its end)."""
    loader.set_epoch(epoch)
    start, cpu, wall, images = received(loader), process_cpu_s(), time.perf_counter(), 0
    for batch in loader:
        images += len(batch.indices)
    wall, cpu = time.perf_counter() - wall, process_cpu_s() - cpu
    return Usage(images, wall, cpu, bytes_per_image(start, received(loader)))
