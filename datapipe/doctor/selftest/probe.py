"""What the GPU checks share: which records they read, how a loader's batches are collected per
record, and a stand-in for the training step's GPU work."""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from .compare import Views


@dataclass(frozen=True)
class Probe:
    """The records every check reads: the first `batches` batches of epoch 0 of `data`, as training
    reads them (train=True: the random crops and flips, and the order, depend on (seed, epoch,
    record) alone, so every backend serves the same views; DALI's training pipeline is the one
    with preallocated nvJPEG buffers), or eval views (center crops, file order)."""

    data: str | Path  # a path or a URL, as make_loader takes it
    batches: int = 6
    batch_size: int = 8
    image_size: int = 128  # the CPU path decodes JPEGs at 1/2..1/8 scale (DCT) when the view is much smaller: at 32 px that alone differed by up to 8 levels on the synthetic sample, at 128 px under 1 (measured)
    workers: int = 2
    train: bool = True

    def loader(self, backend: str, device: torch.device | str, **options):
        from ... import make_loader

        return make_loader(self.data, backend=backend, device=str(device), batch_size=self.batch_size,
                           image_size=self.image_size, train=self.train, num_workers=self.workers, **options)


def collect_views(loader, batches: int) -> Views:
    """record index -> (image on the host, label) over the loader's first `batches` batches of epoch 0."""
    loader.set_epoch(0)
    out = {}
    for images, labels, indices in itertools.islice(loader, batches):
        for i, image, label in zip(indices.tolist(), images.cpu(), labels.tolist()):
            out[i] = (image, label)
    return out


class GpuLoad:
    """GPU work of about `ms` milliseconds on the current stream, as a training step queues it:
    chained matrix products, their count calibrated once with CUDA events."""

    def __init__(self, device: torch.device, ms: float, *, size: int = 2048) -> None:
        self.a = torch.randn(size, size, device=device)
        self.b = torch.randn(size, size, device=device) / size ** 0.5
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        self._run(2)  # warm-up (kernel selection)
        start.record()
        self._run(8)
        end.record()
        end.synchronize()
        self.count = max(1, math.ceil(ms / max(start.elapsed_time(end) / 8, 1e-3)))

    def _run(self, count: int) -> torch.Tensor:
        x = self.a
        for _ in range(count):
            x = x @ self.b
        return x

    def __call__(self) -> None:
        self._run(self.count)
