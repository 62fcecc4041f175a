"""Process-group set-up for torchrun (NCCL on GPU, gloo on CPU) and the few collectives the loop uses."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..devices import resolve_device


@dataclass(frozen=True)
class DistEnv:
    """This process's place in the job, as torchrun describes it (the CLI reads the variables)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def setup(env: DistEnv) -> torch.device:
    """The device this rank trains on; joins the process group when the job has several ranks."""
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    device = resolve_device(None, environ={"LOCAL_RANK": str(env.local_rank)}, device_count=count,
                            current=torch.cuda.current_device)
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.set_device(device)
    if env.distributed and not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo", rank=env.rank, world_size=env.world_size,
                               device_id=device if cuda else None)
    return device


def teardown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def all_sum(values: list[float], device: torch.device) -> list[float]:
    """Element-wise sum over ranks (one collective, one host sync)."""
    t = torch.tensor(values, dtype=torch.float64, device=device)
    if dist.is_initialized():
        dist.all_reduce(t)
    return t.tolist()


def all_max(value: float, device: torch.device) -> float:
    t = torch.tensor([value], dtype=torch.float64, device=device)
    if dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def gather_strings(value: str) -> list[str]:
    """Every rank's string, in rank order (for consistency checks such as weight digests)."""
    if not dist.is_initialized():
        return [value]
    out: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return [str(v) for v in out]
