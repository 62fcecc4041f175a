"""Which records each rank reads, in which order, per epoch: one plan shared by every backend.

An epoch's order is a permutation seeded by (seed, epoch): different every epoch, identical across
runs. Ranks take interleaved slices of it. Without drop_last the order is padded (wrapping around)
to a multiple of world_size, so every rank gets the same number of batches and no rank waits for
another at the end of an epoch; with drop_last each rank drops its incomplete tail instead.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

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


def check_plan(plan: "EpochPlan | ShardPlan") -> None:
    """What every plan refuses: no batch size, no data, or drop_last leaving a rank nothing."""
    if plan.batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {plan.batch_size}")
    if plan.size < 1:
        raise ValueError("the dataset is empty: nothing to load")
    if plan.drop_last and plan.samples_per_rank() < plan.batch_size:
        raise ValueError(f"drop_last with batch_size {plan.batch_size} leaves no batch: each of the "
                         f"{plan.shard.world_size} ranks gets {plan.samples_per_rank()} samples")


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
        check_plan(self)

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

    start = 0  # the position an epoch starts from

    def encode(self, offset: int) -> int:
        return int(offset)

    def decode(self, value: Any) -> int:
        return min(int(value), self.size)

    def save(self, offset: int) -> dict[str, Any]:
        """The position's part of a loader's state_dict."""
        return {"samples_done": int(offset)}

    def restore(self, state: dict[str, Any]) -> int:
        """The position a state_dict saved (states from before positions were global count batches)."""
        if "shard_position" in state:
            raise ValueError("cannot resume: the state was saved with sampling='shards', this loader samples "
                             "globally; resume with sampling='shards'")
        done = state.get("samples_done")
        if done is None:
            done = int(state["batches_done"]) * int(state["batch_size"]) * int(state["world_size"])
        return self.decode(done)

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


READ_AHEAD_SHARDS = 2  # shards a remote dataset's readers fetch ahead of the one they read
Segment = tuple[int, int]  # (world size, samples each rank consumed at that world size)


def shardwise_order(sizes: np.ndarray, *, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    """All record indices, shard by shard: shards in a seeded permutation, records shuffled within
    each shard (records of shard k are numbered contiguously, as in the dataset)."""
    if not shuffle:
        return np.arange(int(sizes.sum()), dtype=np.int64)
    rng = np.random.default_rng([seed, epoch, 1])
    shard_rank = np.empty(len(sizes), np.int64)
    shard_rank[rng.permutation(len(sizes))] = np.arange(len(sizes))
    owner = np.repeat(shard_rank, sizes)
    return np.lexsort((rng.random(len(owner)), owner)).astype(np.int64)


@dataclass(frozen=True)
class ShardPlan:
    """Shard-wise sampling for streamed data: each rank reads a contiguous piece of the epoch's
    shard-by-shard order, so it touches about shards/world shards (plus two it shares at its piece's
    ends) instead of every shard, and a node downloads only what its ranks read.

    A position is the list of (world size, samples each rank consumed) segments of the epoch so far:
    the remainder is rebuilt by replaying them, then dealt to the current ranks in equal contiguous
    pieces (padded from the start of the epoch's order, or trimmed with drop_last). Same world size:
    the exact continuation; another one: every remaining sample exactly once.
    """

    shard_sizes: tuple[int, ...]
    batch_size: int
    shard: Shard = Shard()
    seed: int = 0
    shuffle: bool = True
    drop_last: bool = False

    start = ()

    def __post_init__(self) -> None:
        check_plan(self)

    @property
    def size(self) -> int:
        return int(sum(self.shard_sizes))

    def _piece(self, remaining: int, world: int) -> int:
        return remaining // world if self.drop_last else math.ceil(remaining / world)

    def _after(self, remaining: int, world: int, consumed: int) -> int:
        """How many real samples remain after each of `world` ranks consumed `consumed` of its piece."""
        piece = self._piece(remaining, world)
        left = remaining - world * piece if self.drop_last else 0
        for r in range(world):
            real = max(0, min((r + 1) * piece, remaining) - r * piece)
            left += real - min(consumed, real)
        return left

    def _split(self, position: tuple[Segment, ...]) -> tuple[tuple[Segment, ...], int]:
        """(segments to replay, samples of the current pieces already consumed)."""
        if position and position[-1][0] == self.shard.world_size:
            return position[:-1], position[-1][1]
        return position, 0

    def _remaining(self, segments: tuple[Segment, ...]) -> int:
        remaining = self.size
        for world, consumed in segments:
            remaining = self._after(remaining, world, consumed)
        return remaining

    def samples_per_rank(self, position: tuple[Segment, ...] = ()) -> int:
        segments, consumed = self._split(tuple(position))
        return max(0, self._piece(self._remaining(segments), self.shard.world_size) - consumed)

    def num_batches(self, position: tuple[Segment, ...] = ()) -> int:
        segments, consumed = self._split(tuple(position))
        piece = self._piece(self._remaining(segments), self.shard.world_size)
        if self.drop_last:
            return max(0, piece // self.batch_size - consumed // self.batch_size)
        return max(0, math.ceil(piece / self.batch_size) - math.ceil(consumed / self.batch_size))

    def offset_after(self, position: tuple[Segment, ...], batches: int) -> tuple[Segment, ...]:
        segments, consumed = self._split(tuple(position))
        piece = self._piece(self._remaining(segments), self.shard.world_size)
        return segments + ((self.shard.world_size, min(piece, consumed + batches * self.batch_size)),)

    def encode(self, position: tuple[Segment, ...]) -> list[list[int]]:
        return [[int(w), int(c)] for w, c in position]

    def decode(self, value: Any) -> tuple[Segment, ...]:
        return tuple((int(w), int(c)) for w, c in value)

    def save(self, position: tuple[Segment, ...]) -> dict[str, Any]:
        """The position's part of a loader's state_dict (samples_done, padding included, for reports)."""
        return {"shard_position": self.encode(position),
                "samples_done": sum(world * consumed for world, consumed in position)}

    def restore(self, state: dict[str, Any]) -> tuple[Segment, ...]:
        if "shard_position" not in state:
            if not state.get("samples_done") and not state.get("batches_done"):
                return ()
            raise ValueError("cannot resume: the state was saved with global sampling, this loader samples "
                             "shard-wise; resume with sampling='global'")
        return self.decode(state["shard_position"])

    @property
    def real_samples(self) -> int:
        if self.drop_last:
            return len(self) * self.batch_size
        piece = self._piece(self.size, self.shard.world_size)
        return max(0, min(piece, self.size - self.shard.rank * piece))

    def __len__(self) -> int:
        return self.num_batches(())

    def _deal(self, order: np.ndarray, rest: np.ndarray, world: int) -> tuple[int, np.ndarray]:
        """(piece size, the rest padded from the start of the epoch's order to world x piece)."""
        piece = self._piece(len(rest), world)
        total = world * piece
        if total > len(rest):
            rest = np.concatenate([rest, np.resize(order, total - len(rest))])
        return piece, rest

    def rank_indices(self, epoch: int, position: tuple[Segment, ...] = ()) -> np.ndarray:
        sizes = np.asarray(self.shard_sizes, dtype=np.int64)
        order = shardwise_order(sizes, seed=self.seed, epoch=epoch, shuffle=self.shuffle)
        segments, consumed = self._split(tuple(position))
        rest = order
        for world, used in segments:
            real = len(rest)
            piece, padded_rest = self._deal(order, rest, world)
            tails = [padded_rest[r * piece + min(used, piece): min((r + 1) * piece, real)] for r in range(world)]
            extra = [rest[world * piece:]] if self.drop_last else []
            rest = np.concatenate(tails + extra) if tails else rest[:0]
        piece, padded_rest = self._deal(order, rest, self.shard.world_size)
        mine = padded_rest[self.shard.rank * piece: (self.shard.rank + 1) * piece][consumed:]
        return mine[: self.num_batches(position) * self.batch_size] if self.drop_last else mine

    def batches(self, epoch: int, position: tuple[Segment, ...] = ()) -> list[np.ndarray]:
        mine = self.rank_indices(epoch, position)
        return [mine[i:i + self.batch_size] for i in range(0, len(mine), self.batch_size)]

    def shards_ahead(self, batches: list[np.ndarray], count: int) -> list[tuple[int, ...]]:
        """Per batch: the shards it reads and the next `count` shards after it in this rank's order
        (what to fetch ahead of a remote dataset's readers)."""
        if not batches:
            return []
        shards = self.shard_of(np.concatenate(batches))
        starts = np.flatnonzero(np.r_[True, shards[1:] != shards[:-1]])  # where each run of one shard begins
        hints, begin = [], 0
        for batch in batches:
            end = begin + len(batch)
            first = int(np.searchsorted(starts, begin, side="right")) - 1
            last = int(np.searchsorted(starts, end, side="left"))
            hints.append(tuple(int(shards[starts[k]]) for k in range(first, min(last + count, len(starts)))))
            begin = end
        return hints

    def shard_of(self, indices: np.ndarray) -> np.ndarray:
        first = np.concatenate([[0], np.cumsum(self.shard_sizes)])
        return np.searchsorted(first, indices, side="right") - 1
