"""Batches leave DALI's memory on CUDA: copied into torch's, with DALI's buffers kept until the copy ran.

With DALI's default execution model its PyTorch iterator hands out DALI's own output buffers
(DLPack, no copy), and DALI reuses a buffer once the last reference to it goes. It cannot see torch's
streams: a batch the training step still reads on torch's stream could be handed to the next decode,
and the nvJPEG hardware decoder writes its output at call time, ignoring stream order (torchcodec
#1634, vision #9606). So the loader copies each CUDA batch into memory from torch's caching allocator
(which tracks torch's streams, as for any tensor) on the current stream, records an event after the
copy, and keeps DALI's buffers referenced until that event has passed. The copy of a 256-image
224 px float batch is ~0.3 GB of device memory traffic, a fraction of a millisecond.
"""
from __future__ import annotations

from collections import deque
from typing import Any

import torch

MAX_HELD = 8  # batches the host may run ahead of the GPU's copies before it waits for the oldest


class Handoff:
    """DALI outputs held until the GPU has run the copies that read them."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._held: deque[tuple[torch.cuda.Event, Any]] = deque()

    def own(self, tensor: torch.Tensor, *, dtype: torch.dtype | None = None,
            memory_format: torch.memory_format = torch.contiguous_format) -> torch.Tensor:
        """A copy of a DALI-owned CUDA tensor in torch's memory, queued on the current stream."""
        out = torch.empty(tensor.shape, dtype=dtype or tensor.dtype, device=self.device, memory_format=memory_format)
        return out.copy_(tensor)

    def keep(self, outputs: Any) -> None:
        """Hold `outputs` (DALI's buffers) until the work queued so far on the current stream has run."""
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.device))
        self._held.append((event, outputs))
        self.release()

    def release(self) -> None:
        """Drop the held outputs whose copies have run; wait for the oldest past MAX_HELD."""
        while self._held and (len(self._held) > MAX_HELD or self._held[0][0].query()):
            event, _ = self._held.popleft()
            event.synchronize()

    def __len__(self) -> int:
        return len(self._held)
