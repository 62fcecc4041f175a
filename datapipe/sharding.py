"""Which records each rank reads, in which order, per epoch: one plan shared by every backend.

An epoch's order is a permutation seeded by (seed, epoch): different every epoch, identical across
runs. Ranks take interleaved slices of it. Without drop_last the order is padded (wrapping around)
to a multiple of world_size, so every rank gets the same number of batches and no rank waits for
another at the end of an epoch; with drop_last each rank drops its incomplete tail instead.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Shard:
    """This process's place among the ranks."""

    rank: int = 0
    world_size: int = 1

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {self.world_size}")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank must be within 0..{self.world_size - 1}, got {self.rank}")


def resolve_shard(rank: int | None, world_size: int | None) -> Shard:
    """Explicit values, else torch.distributed's when it is initialized, else a single process."""
    if rank is None or world_size is None:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            rank = dist.get_rank() if rank is None else rank
            world_size = dist.get_world_size() if world_size is None else world_size
    return Shard(rank or 0, world_size or 1)


def epoch_order(size: int, *, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    """All record indices in this epoch's order."""
    if not shuffle:
        return np.arange(size, dtype=np.int64)
    return np.random.default_rng([seed, epoch]).permutation(size).astype(np.int64)


@dataclass(frozen=True)
class EpochPlan:
    """The batches of record indices one rank reads in one epoch."""

    size: int
    batch_size: int
    shard: Shard = Shard()
    seed: int = 0
    shuffle: bool = True
    drop_last: bool = False

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.size < 1:
            raise ValueError("the dataset is empty: nothing to load")
        if self.drop_last and self.samples_per_rank < self.batch_size:
            raise ValueError(f"drop_last with batch_size {self.batch_size} leaves no batch: each of the "
                             f"{self.shard.world_size} ranks gets {self.samples_per_rank} samples")

    @property
    def samples_per_rank(self) -> int:
        if self.drop_last:
            return self.size // self.shard.world_size
        return math.ceil(self.size / self.shard.world_size)

    @property
    def real_samples(self) -> int:
        """How many of this rank's samples are not padding (they come first in its order)."""
        if self.drop_last:
            return len(self) * self.batch_size
        return len(range(self.shard.rank, self.size, self.shard.world_size))

    def __len__(self) -> int:
        """Batches per rank per epoch (the same on every rank)."""
        if self.drop_last:
            return self.samples_per_rank // self.batch_size
        return math.ceil(self.samples_per_rank / self.batch_size)

    def rank_indices(self, epoch: int) -> np.ndarray:
        """This rank's record indices for `epoch`, in order (padded or trimmed as described above)."""
        order = epoch_order(self.size, seed=self.seed, epoch=epoch, shuffle=self.shuffle)
        world = self.shard.world_size
        total = self.samples_per_rank * world
        if total > self.size:
            order = np.concatenate([order, np.resize(order, total - self.size)])
        mine = order[self.shard.rank:total:world]
        return mine[: len(self) * self.batch_size] if self.drop_last else mine

    def batches(self, epoch: int, start: int = 0) -> list[np.ndarray]:
        """This rank's batches for `epoch`, from batch number `start` on (for mid-epoch resume)."""
        mine = self.rank_indices(epoch)
        return [mine[i:i + self.batch_size] for i in range(start * self.batch_size, len(mine), self.batch_size)]
