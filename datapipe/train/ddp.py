"""Process-group set-up for torchrun (NCCL on GPU, gloo on CPU) and the few collectives the loop uses."""
from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..devices import resolve_device
from ..resources import local_world_size

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DistEnv:
    """This process's place in the job, as torchrun describes it (the CLI reads the variables)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int | None = None  # ranks on this node; None: torchrun's LOCAL_WORLD_SIZE (datapipe.resources)

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def group_backend(*, cuda: bool, local_ranks: int, gpus: int) -> str:
    """nccl with a GPU per rank; gloo on CPU, and where ranks on this node outnumber its GPUs:
    ranks then share a GPU (LOCAL_RANK modulo the GPUs), which NCCL refuses ("Duplicate GPU
    detected"), while gloo all-reduces CUDA tensors through the host. Every rank on the node sees the
    same counts, so all choose alike."""
    return "nccl" if cuda and local_ranks <= gpus else "gloo"


def setup(env: DistEnv) -> torch.device:
    """The device this rank trains on; joins the process group when the job has several ranks."""
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    device = resolve_device(None, environ={"LOCAL_RANK": str(env.local_rank)}, device_count=count,
                            current=torch.cuda.current_device)
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.set_device(device)
    if env.distributed and not dist.is_initialized():
        local_ranks = env.local_world_size or local_world_size()
        backend = group_backend(cuda=cuda, local_ranks=local_ranks, gpus=count)
        if cuda and backend == "gloo":
            log.warning("%d ranks on this node share %d GPU(s): NCCL needs one GPU per rank, so the ranks "
                        "communicate through gloo (slower); start one rank per GPU (torchrun --nproc_per_node %d)",
                        local_ranks, count, count)
        dist.init_process_group(backend, rank=env.rank, world_size=env.world_size,
                                device_id=device if backend == "nccl" else None)
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
