"""Which records each rank reads, in which order, per epoch: one plan shared by every backend.

An epoch's order is a permutation seeded by (seed, epoch): different every epoch, identical across
runs. Ranks take interleaved slices of it. Without drop_last the order is padded (wrapping around)
to a multiple of world_size, so every rank gets the same number of batches and no rank waits for
another at the end of an epoch; with drop_last each rank drops its incomplete tail instead.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

log = logging.getLogger(__name__)


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


def epoch_order(size: int, *, seed: int, epoch: int, shuffle: bool, repeats: int = 1) -> np.ndarray:
    """All record indices in this epoch's order. With `repeats` r > 1 (repeated augmentation, timm's
    RepeatAugSampler): each record of the permutation r times in a row, the epoch still `size` long
    (so it holds size / r records), the k-th copy of record i written as the key i + k * size
    (`record_of` and `repeat_key` read it): its augmentation is drawn for that key, so the copies
    differ. Ranks take interleaved positions, so a record's copies go to different ranks."""
    if not shuffle:
        return np.arange(size, dtype=np.int64)
    order = np.random.default_rng([seed, epoch]).permutation(size).astype(np.int64)
    if repeats == 1:
        return order
    held = -(-size // repeats)  # the records this epoch holds: the first of the permutation
    copy = np.tile(np.arange(repeats, dtype=np.int64), held)[:size]
    return np.repeat(order[:held], repeats)[:size] + copy * size  # O(size) memory, not O(size x repeats)


def record_of(key: int, size: int) -> int:
    """The record a plan's key (a record index, or a repeat's key i + k * size) stands for."""
    return key % size


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
    repeats: int = 1  # repeated augmentation: each record's copies in a row (epoch_order)

    def __post_init__(self) -> None:
        check_plan(self)
        if self.repeats < 1:
            raise ValueError(f"repeats must be >= 1, got {self.repeats}")

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
        order = epoch_order(self.size, seed=self.seed, epoch=epoch, shuffle=self.shuffle, repeats=self.repeats)
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
MIX_SHARDS = 16  # ShardPlan.mix_shards' default: shards whose samples one block interleaves (see ShardPlan)
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


def mix_blocks(piece: np.ndarray, shards: np.ndarray, mix: int, rng: np.random.Generator) -> np.ndarray:
    """`piece` (record indices, each shard's in one run; `shards` their shard numbers) cut into blocks of
    consecutive runs, as few as hold at most `mix` runs each and as even as can be (no small last
    block), each block interleaved: sample j of a run of n goes to (j + u) / n of the way through its
    block (u uniform in [0, 1)), so any stretch of a block draws about equally from all of the
    block's shards, in a random order. Blocks keep their place, so a block's shards are all that is
    read while it is."""
    if mix <= 1 or len(piece) < 2:
        return piece
    new_run = np.r_[True, shards[1:] != shards[:-1]]
    run = np.cumsum(new_run) - 1
    starts = np.flatnonzero(new_run)
    sizes = np.diff(np.r_[starts, len(piece)])
    key = (np.arange(len(piece)) - starts[run] + rng.random(len(piece))) / sizes[run]
    blocks = -(-len(starts) // mix)
    return piece[np.lexsort((key, run * blocks // len(starts)))]


@dataclass(frozen=True)
class ShardPlan:
    """Shard-wise sampling for streamed data: each rank reads a contiguous piece of the epoch's
    shard-by-shard order, so it touches about shards/world shards (plus two it shares at its piece's
    ends) instead of every shard, and a node downloads only what its ranks read.

    Mixing (when shuffling): a rank's piece is read in blocks of `mix_shards` consecutive shards, each
    block interleaved (`mix_blocks`), so a batch draws about equally from the block's shards instead of
    one or two: a dataset written class by class then gives batches about as balanced as a random
    permutation (tests/test_shard_mixing.py). Like Streaming's block shuffles (py1b, py1e) and
    webdataset's shuffle buffer over several open shards, memory stays bounded: a block's shards are
    all a rank reads at once, two blocks where one ends, and the next block's shards are fetched one
    by one while the current one is read (`shards_ahead`). Default 16: on shards written class by
    class (64 x 32 samples, 8 classes, 2 ranks, batches of 32) a batch's label histogram is then
    about 1.2x as far from the dataset's as under a random permutation (8 shards: 1.7x, shard by
    shard: 4.8x), while a rank's cache holds about 2 x 16 shards (0.5-8 GiB at this converter's
    16-256 MiB shards; `backends.shards_held`). Streaming's default block (2^18 samples) spans
    hundreds of shards; webdataset's usual 1,000-5,000-sample buffer draws from the one or two shards
    a worker has open. Bigger batches need more shards for the same balance. mix_shards=1: shard by
    shard, as before.

    A position is the list of (world size, samples each rank consumed) segments of the epoch so far:
    the remainder is rebuilt by replaying them (each rank consumed a prefix of its mixed piece; what is
    left goes back to the epoch's shard-by-shard order), then dealt to the current ranks in equal
    contiguous pieces (padded from the start of the epoch's order, or trimmed with drop_last), each
    mixed with a seed of (seed, epoch, segment, world, rank). Same world size: the exact continuation;
    another one: every remaining sample exactly once.
    """

    shard_sizes: tuple[int, ...]
    batch_size: int
    shard: Shard = Shard()
    seed: int = 0
    shuffle: bool = True
    drop_last: bool = False
    mix_shards: int = MIX_SHARDS

    start = ()

    def __post_init__(self) -> None:
        check_plan(self)
        if not isinstance(self.mix_shards, int) or self.mix_shards < 1:
            raise ValueError(f"mix_shards must be an int >= 1 (1: shard by shard), got {self.mix_shards!r}")

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
        return {"shard_position": self.encode(position), "mix_shards": self.mix_shards,
                "samples_done": sum(world * consumed for world, consumed in position)}

    def restore(self, state: dict[str, Any]) -> tuple[Segment, ...]:
        if "shard_position" not in state:
            if not state.get("samples_done") and not state.get("batches_done"):
                return ()
            raise ValueError("cannot resume: the state was saved with global sampling, this loader samples "
                             "shard-wise; resume with sampling='global'")
        position = self.decode(state["shard_position"])
        saved = int(state.get("mix_shards", 1))  # states from before mixing read shard by shard
        if position and self.shuffle and saved != self.mix_shards:
            log.warning("resuming mid-epoch from a state saved with mix_shards=%d, this plan mixes %d: the rest "
                        "of epoch %s may repeat or miss some samples; the next epochs are exact", saved,
                        self.mix_shards, state.get("epoch", "?"))
        return position

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

    def _mixed(self, piece: np.ndarray, epoch: int, segment: int, world: int, rank: int) -> np.ndarray:
        """A rank's piece (real samples, in the epoch's shard-by-shard order) in reading order."""
        if not self.shuffle or self.mix_shards <= 1:
            return piece
        rng = np.random.default_rng([self.seed, epoch, 2, segment, world, rank])
        return mix_blocks(piece, self.shard_of(piece), self.mix_shards, rng)

    def rank_indices(self, epoch: int, position: tuple[Segment, ...] = ()) -> np.ndarray:
        sizes = np.asarray(self.shard_sizes, dtype=np.int64)
        order = shardwise_order(sizes, seed=self.seed, epoch=epoch, shuffle=self.shuffle)
        segments, consumed = self._split(tuple(position))
        rest, place = order, np.empty_like(order)
        place[order] = np.arange(len(order))  # where each record stands in the epoch's order
        for k, (world, used) in enumerate(segments):
            piece = self._piece(len(rest), world)  # rank r consumed a prefix of its mixed real samples
            tails = [self._mixed(rest[r * piece:(r + 1) * piece], epoch, k, world, r)[used:] for r in range(world)]
            extra = [rest[world * piece:]] if self.drop_last else []
            rest = np.concatenate(tails + extra) if tails else rest[:0]
            rest = order[np.sort(place[rest])]  # back in the epoch's order: each shard's rest in one run
        world, rank = self.shard.world_size, self.shard.rank
        piece, padded_rest = self._deal(order, rest, world)
        real = max(0, min(piece, len(rest) - rank * piece))
        ours = padded_rest[rank * piece: (rank + 1) * piece]
        mine = np.concatenate([self._mixed(ours[:real], epoch, len(segments), world, rank), ours[real:]])[consumed:]
        return mine[: self.num_batches(position) * self.batch_size] if self.drop_last else mine

    def batches(self, epoch: int, position: tuple[Segment, ...] = ()) -> list[np.ndarray]:
        mine = self.rank_indices(epoch, position)
        return [mine[i:i + self.batch_size] for i in range(0, len(mine), self.batch_size)]

    def shards_ahead(self, batches: list[np.ndarray], count: int) -> list[tuple[int, ...]]:
        """Per batch: the shards it reads, then those to fetch ahead of a remote dataset's readers: the
        next `count` shards this rank has not read yet, and, when mixing, each shard from
        mix_shards - 1 shards' worth of samples before it would start in the unmixed order, so the
        next block's shards are fetched one by one while the current block is read."""
        if not batches:
            return []
        shards = self.shard_of(np.concatenate(batches))
        found, first = np.unique(shards, return_index=True)
        by_first = np.argsort(first)
        upcoming, first = found[by_first], first[by_first]  # shards in the order they are first read
        counts = np.bincount(shards)[upcoming]
        unmixed = np.r_[0, np.cumsum(counts)[:-1]]  # where each would start, were the blocks not mixed
        mix = self.mix_shards if self.shuffle else 1
        lead = (mix - 1) * self.size // len(self.shard_sizes)
        hints, begin = [], 0
        for batch in batches:
            end = begin + len(batch)
            read = shards[begin:end]
            own = read[np.sort(np.unique(read, return_index=True)[1])]
            new = int(np.searchsorted(first, end))
            upto = max(new + count, int(np.searchsorted(unmixed, end + lead)))
            hints.append(tuple(int(s) for s in own) + tuple(int(s) for s in upcoming[new:upto]))
            begin = end
        return hints

    def shard_of(self, indices: np.ndarray) -> np.ndarray:
        first = np.concatenate([[0], np.cumsum(self.shard_sizes)])
        return np.searchsorted(first, indices, side="right") - 1
