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
    """The batches of record indices one rank reads in one epoch, from any global position on.

    A global position (`offset`) counts the samples of the epoch's order that all ranks together
    have consumed: after k batches on every rank it is k x batch_size x world_size. The rest of the
    epoch is order[offset:], dealt to the ranks interleaved and padded (or trimmed) as above, so a
    run resumed at another world size still reads every remaining sample exactly once.
    """

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
        if self.drop_last and self.samples_per_rank() < self.batch_size:
            raise ValueError(f"drop_last with batch_size {self.batch_size} leaves no batch: each of the "
                             f"{self.shard.world_size} ranks gets {self.samples_per_rank()} samples")

    def samples_per_rank(self, offset: int = 0) -> int:
        """This rank's sample count from global position `offset` to the end of the epoch."""
        remaining = max(0, self.size - offset)
        if self.drop_last:
            return remaining // self.shard.world_size
        return math.ceil(remaining / self.shard.world_size)

    def num_batches(self, offset: int = 0) -> int:
        """Batches per rank from global position `offset` on (the same on every rank)."""
        if self.drop_last:
            return self.samples_per_rank(offset) // self.batch_size
        return math.ceil(self.samples_per_rank(offset) / self.batch_size)

    def offset_after(self, offset: int, batches: int) -> int:
        """The global position after every rank read `batches` more batches from `offset`."""
        return min(self.size, offset + batches * self.batch_size * self.shard.world_size)

    @property
    def real_samples(self) -> int:
        """How many of this rank's samples are not padding (they come first in its order)."""
        if self.drop_last:
            return len(self) * self.batch_size
        return len(range(self.shard.rank, self.size, self.shard.world_size))

    def __len__(self) -> int:
        """Batches per rank per whole epoch."""
        return self.num_batches(0)

    def rank_indices(self, epoch: int, offset: int = 0) -> np.ndarray:
        """This rank's record indices for `epoch` from global position `offset`, in order. Padding
        wraps around to the start of the epoch's order, whatever the offset, so a resumed epoch pads
        with the same samples as an unbroken one."""
        order = epoch_order(self.size, seed=self.seed, epoch=epoch, shuffle=self.shuffle)
        world = self.shard.world_size
        rest = order[min(offset, self.size):]
        total = self.samples_per_rank(offset) * world
        if total > len(rest):
            rest = np.concatenate([rest, np.resize(order, total - len(rest))])
        mine = rest[self.shard.rank:total:world]
        return mine[: self.num_batches(offset) * self.batch_size] if self.drop_last else mine

    def batches(self, epoch: int, offset: int = 0) -> list[np.ndarray]:
        """This rank's batches for `epoch` from global position `offset` on."""
        mine = self.rank_indices(epoch, offset)
        return [mine[i:i + self.batch_size] for i in range(0, len(mine), self.batch_size)]
