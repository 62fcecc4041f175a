"""uint8 images -> normalized images in the configured dtype and memory format: a whole batch on the
device (the dataloader backend, the thread backend on CUDA), or one sample at a time into its row of a
host batch (the thread backend on a CPU device: each decode thread normalizes its own sample while
the pixels are still in its cache, so no pass over the whole batch remains for the consumer)."""
from __future__ import annotations

import threading

import torch

from .base import Batch
from .host_batches import BatchPool

try:
    from .. import _normalize
except ImportError:  # not built (setup.py's optional extension): torch's ops give the same values
    _normalize = None

from ..augment.recipe import IMAGENET_MEAN, IMAGENET_STD


_SCRATCH = threading.local()
_SAME_SIZE_INT = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}


class Normalizer:
    """uint8 NCHW (any device) -> normalized NCHW in the target dtype and memory format, on the device."""

    def __init__(self, device: torch.device, dtype: torch.dtype, channels_last: bool, *, keep: int = 4,
                 mean: tuple[float, ...] = IMAGENET_MEAN, std: tuple[float, ...] = IMAGENET_STD) -> None:
        """keep: how many host batches the pool may hold for reuse (a CPU device): those handed out
        and not yet let go of, plus those being filled. dtype uint8: no normalization (the pixels)."""
        self.device, self.dtype, self.channels_last = device, dtype, channels_last
        self.raw = dtype == torch.uint8
        std_t = torch.tensor(std, device=device)
        self.scale = (1 / (std_t * 255)).view(1, 3, 1, 1)  # (x - 255 mean) / (255 std) = x * scale + bias
        self.bias = (-torch.tensor(mean, device=device) / std_t).view(1, 3, 1, 1)
        self._row_scale, self._row_bias = self.scale[0], self.bias[0]  # one image's: sample_into, per sample
        self.pool = BatchPool(keep) if device.type == "cpu" else None
        self._table = self._value_table() if device.type == "cpu" and not self.raw else None

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        if self.device.type != "cpu":
            return self._normalize(images)
        # On a CPU device the decode workers own the cores. This pass is memory-bound (one thread is
        # as fast as two, measured), and a parallel one leaves OpenMP threads spinning afterwards.
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return self._normalize(images)
        finally:
            torch.set_num_threads(threads)

    def batch(self, images: torch.Tensor, labels: torch.Tensor, indices: torch.Tensor) -> Batch:
        """A host batch (uint8 images) on the device: images normalized, labels moved, indices kept."""
        return Batch(self(images), labels.to(self.device, non_blocking=True), indices)

    def empty(self, count: int, image_size: int) -> torch.Tensor:
        """An uninitialised batch of `count` images in the output dtype and format (on a CPU device,
        for `sample_into` to fill)."""
        return self._empty(torch.Size((count, 3, image_size, image_size)), self.dtype)

    def release(self) -> None:
        """Let go of the host batches kept for reuse (at the end of an iteration)."""
        if self.pool is not None:
            self.pool.clear()

    def sample_into(self, row: torch.Tensor, pixels: torch.Tensor) -> None:
        """Normalize one uint8 CHW image into `row` (one image of an `empty` batch, host memory): the
        values `__call__` gives on a batch. Safe to call from several threads at once. With the
        compiled table (datapipe._normalize): one pass, the GIL released; else torch's operations,
        in `__call__`'s order."""
        if self.raw:
            row.copy_(pixels)
            return
        out = row.permute(1, 2, 0) if self.channels_last else row  # the row's memory order
        if _normalize is not None and out.is_contiguous() and pixels.is_contiguous():
            _normalize.normalize_into(pixels.numpy(), out.view(_SAME_SIZE_INT[self.dtype]).numpy(), self._table,
                                      self.channels_last)
            return
        if self.dtype == torch.float32:
            row.copy_(pixels)
            row.mul_(self._row_scale).add_(self._row_bias)
            return
        scratch = getattr(_SCRATCH, "image", None)  # float32 first, as __call__ does, then the dtype
        if scratch is None or scratch.shape != pixels.shape:
            scratch = _SCRATCH.image = torch.empty(pixels.shape, dtype=torch.float32)
        scratch.copy_(pixels)
        row.copy_(scratch.mul_(self._row_scale).add_(self._row_bias))

    def _value_table(self) -> bytes:
        """Each of the 256 uint8 values of each channel normalized by `_normalize`'s operations
        (to float32, times scale, plus bias, then to the dtype), as 3 x 256 items: sample_into's table."""
        table = torch.arange(256, dtype=torch.uint8).expand(3, 256).float()
        table.mul_(self.scale.view(3, 1)).add_(self.bias.view(3, 1))
        return table.to(self.dtype).view(_SAME_SIZE_INT[self.dtype]).numpy().tobytes()

    def _empty(self, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
        if self.pool is not None:
            return self.pool.empty(shape, dtype, self.channels_last)
        memory_format = torch.channels_last if self.channels_last else torch.contiguous_format
        return torch.empty(shape, dtype=dtype, device=self.device, memory_format=memory_format)

    def _normalize(self, images: torch.Tensor) -> torch.Tensor:
        if self.raw:
            return self._empty(images.shape, torch.uint8).copy_(images.to(self.device, non_blocking=True))
        out = self._empty(images.shape, torch.float32)
        out.copy_(images.to(self.device, non_blocking=True))  # uint8 -> float (and layout) in one pass
        out.mul_(self.scale).add_(self.bias)
        if self.dtype == torch.float32:
            return out
        return self._empty(images.shape, self.dtype).copy_(out)
