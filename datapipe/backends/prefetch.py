"""CUDA-stream prefetcher (after timm's PrefetchLoader): batch k+1 is copied and normalized on a
side stream while batch k trains. Without CUDA the same code runs with no streams."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from .base import Batch
from .dataloader import ProcessLoader


class PrefetchLoader(ProcessLoader):
    """The dataloader backend plus one batch of look-ahead on the device."""

    backend = "prefetch"

    def _iterate(self, epoch: int, offset: int) -> Iterator[Batch | tuple[Batch, dict]]:
        cuda = self.device.type == "cuda"
        stream = torch.cuda.Stream(device=self.device) if cuda else None
        current = torch.cuda.current_stream(self.device) if cuda else None
        ready: Batch | None = None
        try:
            for host in self.host_batches(epoch, offset):
                with torch.cuda.stream(stream) if cuda else contextlib.nullcontext():
                    upcoming = self.device_batch(host)
                if ready is not None:
                    yield ready  # the caller queues its step on the current stream before we return here
                if cuda:
                    current.wait_stream(stream)  # upcoming's copy + normalize precede any use of it
                    batch = upcoming if self.field_spec is None else upcoming[0]
                    for tensor in (batch.images, batch.labels):  # indices stay on the host
                        tensor.record_stream(current)  # its memory is not reused while current may read it
                ready = upcoming
            if ready is not None:
                yield ready
        finally:
            self.normalize.release()
