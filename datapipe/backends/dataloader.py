"""torch DataLoader backend: decode + augment to uint8 in worker processes, normalize on the device."""
from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np
import torch

from ..formats.base import Dataset
from ..sharding import EpochPlan
from ..transforms import decode_view, sample_rng
from .base import Batch, Loader, LoaderOptions, Normalizer

log = logging.getLogger(__name__)


class BadSample(NamedTuple):
    index: int
    path: str
    reason: str


class DecodedRecords(torch.utils.data.Dataset):
    """(epoch, index) -> (uint8 CHW tensor, label, index), or a BadSample under on_error="skip"."""

    def __init__(self, dataset: Dataset, options: LoaderOptions) -> None:
        self.dataset = dataset
        self.size, self.train, self.seed = options.image_size, options.train, options.seed
        self.raise_errors = options.on_error == "raise"

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, item: tuple[int, int]) -> tuple[torch.Tensor, int, int] | BadSample:
        epoch, index = item
        sample = self.dataset[index]
        try:
            pixels = decode_view(sample.data, self.size, train=self.train, rng=sample_rng(self.seed, epoch, index))
        except Exception as exc:  # PIL raises many types for bad bytes; the path is what matters
            path = self.dataset.record(index).path  # metadata read only on this rare path
            if self.raise_errors:
                raise RuntimeError(f"cannot decode record {index} ({path}): {exc}") from exc
            return BadSample(index, path, f"{type(exc).__name__}: {exc}")
        return pixels, sample.label, index


def collate(items: list) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[BadSample]]:
    """Stack the good samples (uint8 NCHW) and pass the bad ones on for counting."""
    good = [it for it in items if not isinstance(it, BadSample)]
    bad = [it for it in items if isinstance(it, BadSample)]
    if not good:
        return torch.empty(0, dtype=torch.uint8), torch.empty(0, dtype=torch.int64), torch.empty(0, dtype=torch.int64), bad
    first = good[0][0]
    out = None
    if torch.utils.data.get_worker_info() is not None:  # stack straight into shared memory (no copy on send)
        storage = first.untyped_storage()._new_shared(len(good) * first.numel() * first.element_size())
        out = first.new(storage).view(len(good), *first.shape)
    images = torch.stack([g[0] for g in good], out=out)
    labels = torch.tensor([g[1] for g in good], dtype=torch.int64)
    indices = torch.tensor([g[2] for g in good], dtype=torch.int64)
    return images, labels, indices, bad


class EpochBatches:
    """The batch sampler: lists of (epoch, index) for the configured epoch, from a start batch on."""

    def __init__(self, plan: EpochPlan) -> None:
        self.plan, self.epoch, self.start = plan, 0, 0

    def __len__(self) -> int:
        return len(self.plan) - self.start

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        for batch in self.plan.batches(self.epoch, self.start):
            yield [(self.epoch, int(i)) for i in batch]


def _seed_worker(worker_id: int) -> None:
    seed = torch.initial_seed() % 2**32
    np.random.seed(seed)


class DataLoaderLoader(Loader):
    """Pinned-memory multi-worker DataLoader; uint8 crosses to the device, float work happens there."""

    backend = "dataloader"

    def __init__(self, dataset: Dataset, plan: EpochPlan, options: LoaderOptions, *, reason: str = "") -> None:
        super().__init__(dataset, plan, options, reason=reason)
        self.device = options.torch_device
        pin = options.pin_memory if options.pin_memory is not None else self.device.type == "cuda"
        workers = options.workers
        self.sampler = EpochBatches(plan)
        self.loader = torch.utils.data.DataLoader(
            DecodedRecords(dataset, options), batch_sampler=self.sampler, collate_fn=collate,
            num_workers=workers, pin_memory=pin, worker_init_fn=_seed_worker,
            prefetch_factor=options.prefetch_factor if workers else None, persistent_workers=workers > 0)
        self.normalize = Normalizer(self.device, options.dtype, options.channels_last)
        self.skipped: list[BadSample] = []

    def host_batches(self, epoch: int, start: int) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """uint8 NCHW batches on the host (pinned where CUDA is used), bad samples counted and logged."""
        self.sampler.epoch, self.sampler.start = epoch, start
        for images, labels, indices, bad in self.loader:
            for b in bad:
                log.warning("skipped record %d (%s): %s", b.index, b.path, b.reason)
            self.skipped.extend(bad)
            if len(indices):
                yield images, labels, indices

    def to_device(self, images: torch.Tensor, labels: torch.Tensor, indices: torch.Tensor) -> Batch:
        return Batch(self.normalize(images), labels.to(self.device, non_blocking=True), indices)

    def _iterate(self, epoch: int, start: int) -> Iterator[Batch]:
        for host in self.host_batches(epoch, start):
            yield self.to_device(*host)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "skipped": len(self.skipped)}
