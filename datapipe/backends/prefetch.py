"""CUDA-stream prefetcher (after timm's PrefetchLoader): batch k+1 is copied and normalized on a
side stream while batch k trains. Without CUDA the same code runs with no streams."""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator

import torch

from .base import Batch
from .dataloader import ProcessLoader

DeviceBatch = Batch | tuple[Batch, dict]


def ahead_on_stream(device: torch.device, hosts: Iterable[tuple],
                    to_device: Callable[[tuple], DeviceBatch]) -> Iterator[DeviceBatch]:
    """`to_device(host)` of each host batch, one batch ahead: on CUDA the next batch's copy (from
    pinned memory) and normalization run on a side stream while the caller's step on the current
    stream uses the batch before it. Elsewhere, the same order with no streams."""
    cuda = device.type == "cuda"
    stream = torch.cuda.Stream(device=device) if cuda else None
    current = torch.cuda.current_stream(device) if cuda else None
    ready: DeviceBatch | None = None
    for host in hosts:
        with torch.cuda.stream(stream) if cuda else contextlib.nullcontext():
            upcoming = to_device(host)
        if ready is not None:
            yield ready  # the caller queues its step on the current stream before we return here
        if cuda:
            current.wait_stream(stream)  # upcoming's copy + normalize precede any use of it
            batch = upcoming if isinstance(upcoming, Batch) else upcoming[0]
            for tensor in (batch.images, batch.labels):  # indices stay on the host
                tensor.record_stream(current)  # its memory is not reused while current may read it
        ready = upcoming
    if ready is not None:
        yield ready


class PrefetchLoader(ProcessLoader):
    """The dataloader backend plus one batch of look-ahead on the device."""

    backend = "prefetch"

    def _iterate(self, epoch: int, offset: int) -> Iterator[DeviceBatch]:
        try:
            yield from ahead_on_stream(self.device, self.host_batches(epoch, offset), self.device_batch)
        finally:
            self.normalize.release()
