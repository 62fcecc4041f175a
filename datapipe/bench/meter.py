"""What a loader costs beside images/s: the CPU time per image of the process that trains and of the
loader's pool, and, for backend="ray", the bytes of the host batches received per image (what the
network carries).

Trainer CPU is time.process_time(): this process and its threads (decode threads, DALI's, the trainer's
own loop), not its worker processes nor a Ray pool's actors. Pool CPU is the CPU of the loader's workers
wherever they run, read at the window's start and end: the `threads` backend's decode threads (inside
this process, so inside the trainer's figure too), DataLoader worker processes (dataloader, prefetch, the
naive baseline), the Ray actors' processes (bench/pool.py). Linux /proc; None where it cannot be read.
Shared by the bench's timed windows (window.timed) and tools/bench_ray_pool.py (epoch_usage)."""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

process_cpu_s = time.process_time  # the CPU clock of every trainer figure
Reading = dict[Hashable, float]  # CPU seconds so far, per thread, process or actor
PoolMeter = Callable[[], Callable[[], float | None]]  # start() -> stop() -> the pool's CPU seconds between


def per_image_ms(cpu_s: float, images: int) -> float:
    return 1000 * cpu_s / images if images else 0.0


def cpu_between(before: Reading | None, after: Reading | None) -> float | None:
    """CPU seconds the pool used between two readings; None where one is missing, the pool is empty, or
    a member read first is gone at the end (its seconds since are unknown). A member new at the end
    started in between: all its seconds count."""
    if before is None or after is None or not after or not before.keys() <= after.keys():
        return None
    return sum(after[k] - before.get(k, 0.0) for k in after)


def meter_of(read: Callable[[], Reading | None]) -> PoolMeter:
    """A PoolMeter over a reading function that answers at once."""
    def start() -> Callable[[], float | None]:
        before = read()
        return lambda: cpu_between(before, read())
    return start


def _stat_cpu_s(path: str) -> float:
    """utime + stime of a /proc .../stat file, in seconds."""
    fields = Path(path).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _threads_cpu(tids: set[int]) -> Reading:
    """CPU seconds of this process's threads `tids` that are still there."""
    reading: Reading = {}
    for tid in tids:
        try:
            reading[tid] = _stat_cpu_s(f"/proc/self/task/{tid}/stat")
        except (OSError, IndexError, ValueError):  # it ended
            continue
    return reading


def decode_threads(prefix: str) -> PoolMeter:
    """A PoolMeter over this process's threads named `prefix`*: the process's CPU less that of its other
    threads, those there at the start (the trainer's loop, torch's, DALI's). So decode threads started
    later count, and so do those that ended before the end (the threads backend ends them at the epoch's
    end: Python forgets a joined thread before its OS thread is gone). Another thread that ends meanwhile
    (one of an earlier loader, still exiting) adds the seconds it ran after the start."""
    def start() -> Callable[[], float | None]:
        try:
            tids = {int(tid) for tid in os.listdir("/proc/self/task")}
        except OSError:
            return lambda: None
        named = {t.native_id for t in threading.enumerate() if t.name.startswith(prefix)}
        others = tids - named
        before, cpu0 = _threads_cpu(others), process_cpu_s()

        def stop() -> float | None:
            after, cpu = _threads_cpu(others), process_cpu_s()
            return cpu - cpu0 - sum(after[tid] - before[tid] for tid in after.keys() & before.keys())
        return stop
    return start


def children(pid: int) -> list[int]:
    """The live child processes of `pid` (Linux /proc)."""
    kids = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            kids += [int(c) for c in (task / "children").read_text().split()]
        except OSError:  # a thread that ended while we looked
            continue
    return kids


def processes_cpu(skip: frozenset[int] = frozenset()) -> Reading | None:
    """CPU seconds of this process's live descendants by pid, leaving out the subtrees under `skip`
    (processes that were there before the loader: a local Ray's daemons, other loaders' workers)."""
    try:
        pending, reading = [p for p in children(os.getpid()) if p not in skip], {}
    except OSError:
        return None
    while pending:
        pid = pending.pop()
        try:
            reading[pid] = _stat_cpu_s(f"/proc/{pid}/stat")
            pending += [p for p in children(pid) if p not in skip]
        except (OSError, IndexError, ValueError):  # a child that exited while we looked
            continue
    return reading


class WorkerProcesses:
    """A PoolMeter over the worker processes one loader starts: mark() before each of its iterations;
    the processes there at the first mark (a local Ray's daemons, other loaders' workers) are left out."""

    def __init__(self) -> None:
        self.skip: frozenset[int] | None = None

    def mark(self) -> None:
        if self.skip is None:
            self.skip = frozenset(processes_cpu() or ())

    def __call__(self) -> Callable[[], float | None]:
        return meter_of(lambda: processes_cpu(self.skip or frozenset()))()


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
