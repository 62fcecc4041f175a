"""Which device a process's loader and model use: the rank's own GPU, resolved once by one rule.

torch's current device is GPU 0 in every process until something calls torch.cuda.set_device, so a
loader left to default to it would decode on GPU 0 in all eight ranks of a torchrun job. The rule:
an explicit index (or a non-CUDA device) is kept; "cuda" or None takes LOCAL_RANK (torchrun sets it)
modulo the GPUs visible, else the current device; None without CUDA is the CPU.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Mapping

import torch


def resolve_device(device: str | torch.device | None, *, environ: Mapping[str, str], device_count: int,
                   current: Callable[[], int]) -> torch.device:
    """The device to use; on CUDA always with an index. `current` is asked only when neither the
    device nor LOCAL_RANK decides (asking torch initialises CUDA)."""
    if device is None and device_count == 0:
        return torch.device("cpu")
    chosen = torch.device("cuda" if device is None else device)
    if chosen.type != "cuda":
        return chosen
    if device_count == 0:
        raise ValueError(f"device={str(chosen)!r} but no CUDA GPU is visible (torch.cuda.is_available() is "
                         "False): use device='cpu', or None to pick the GPU where there is one")
    if chosen.index is not None:
        if chosen.index >= device_count:
            raise ValueError(f"device={str(chosen)!r} but only {device_count} CUDA GPU(s) are visible: use an "
                             f"index below {device_count}, or 'cuda' for this rank's GPU (LOCAL_RANK)")
        return chosen
    local_rank = environ.get("LOCAL_RANK", "")
    index = int(local_rank) % device_count if local_rank.isdigit() else current()
    return torch.device("cuda", index)


def rank_device(device: str | torch.device | None = None) -> torch.device:
    """resolve_device for this process: its environment, the GPUs it sees, torch's current device."""
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return resolve_device(device, environ=os.environ, device_count=count, current=torch.cuda.current_device)
