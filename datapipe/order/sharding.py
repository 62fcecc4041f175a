"""Which records each rank reads, in which order, per epoch: one order shared by every backend.

An epoch's order is a permutation keyed by (seed, epoch) and computed, not stored
(datapipe.order.permutation.Permutation): position i of the epoch maps to its record in O(1) time and memory,
so a rank never holds an array of the epoch's records, only the batch it is asked for. Different
every epoch, identical across runs. Ranks take interleaved positions. Without drop_last the order
is padded (wrapping around) to a multiple of world_size, so every rank gets the same number of
batches and no rank waits for another at the end of an epoch; with drop_last each rank drops its
incomplete tail instead.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from ..checks import integer, shown
from .permutation import Batches, Permutation, derive_key
from .shardwise import InterleavedPiece, RankStream, Rest, ShardwisePermutation

log = logging.getLogger(__name__)
ORDER = "feistel-1"  # the epoch order's version, saved with every position: a mid-epoch resume needs the same order


@dataclass(frozen=True)
class Shard:
    """This process's place among the ranks."""

    rank: int = 0
    world_size: int = 1

    def __post_init__(self) -> None:
        world = integer("world_size", self.world_size, 1)  # the type first: "2" or 2.5 is not a world size
        integer("rank", self.rank, 0, world - 1)


def resolve_shard(rank: int | None, world_size: int | None) -> Shard:
    """Explicit values, else torch.distributed's when it is initialized, else a single process."""
    if rank is None or world_size is None:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            rank = dist.get_rank() if rank is None else rank
            world_size = dist.get_world_size() if world_size is None else world_size
    return Shard(rank or 0, world_size or 1)


class EpochKeys:
    """Position -> key in one epoch's order, for any positions, without the order held: the records
    permuted by (seed, epoch). With `repeats` r > 1 (repeated augmentation, timm's RepeatAugSampler):
    each record of the permutation r times in a row, the epoch still `size` long (so it holds size / r
    records), the k-th copy of record i written as the key i + k * size (`record_of` reads it): its
    augmentation is drawn for that key, so the copies differ. Ranks take interleaved positions, so a
    record's copies go to different ranks. Unshuffled: the key is the position."""

    def __init__(self, size: int, *, seed: int, epoch: int, shuffle: bool, repeats: int = 1) -> None:
        self.size, self.repeats = size, repeats
        self.permutation = Permutation(size, derive_key(seed, epoch)) if shuffle else None

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        positions = np.asarray(positions, dtype=np.int64)
        if self.permutation is None:
            return positions
        if self.repeats == 1:
            return self.permutation(positions)
        return self.permutation(positions // self.repeats) + positions % self.repeats * self.size


def refuse_another_order(state: dict[str, Any], mid_epoch: bool, shuffle: bool) -> None:
    """A mid-epoch position saved under another epoch order (no `order`: a datapipe from before the
    computed order, #33) would resume into other records: refused. At an epoch boundary, or without
    shuffling (the stored order either way), any state resumes."""
    saved = state.get("order", "numpy-permutation")
    if mid_epoch and shuffle and saved != ORDER:
        raise ValueError(f"cannot resume mid-epoch: the state was saved with the epoch order {saved!r}, this datapipe "
                         f"computes {ORDER!r}; resume from a state saved at an epoch boundary, or with the datapipe "
                         "version that wrote it")


def refuse_mix_state(state: dict[str, Any]) -> None:
    """A state saved over a Mix counts positions in the mix's epoch, not this dataset's."""
    if "mix" in state:
        names = state["mix"].get("names") if isinstance(state["mix"], dict) else None
        raise ValueError(f"cannot resume: the state was saved by a loader over a Mix of {names}, "
                         "this loader reads one dataset; resume with the Mix it was saved with")


def record_of(key: int, size: int) -> int:
    """The record an order's key (a record index, or a repeat's key i + k * size) stands for."""
    return key % size


def check_order(order: "EpochOrder | ShardOrder") -> None:
    """What every order refuses: no batch size, no data, or drop_last leaving a rank nothing."""
    if order.batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {order.batch_size}")
    if order.size < 1:
        raise ValueError("the dataset is empty: nothing to load")
    if order.drop_last and order.samples_per_rank() < order.batch_size:
        raise ValueError(f"drop_last with batch_size {order.batch_size} leaves no batch: each of the "
                         f"{order.shard.world_size} ranks gets {order.samples_per_rank()} samples")


@dataclass(frozen=True)
class EpochOrder:
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
    repeats: int = 1  # repeated augmentation: each record's copies in a row (EpochKeys)

    def __post_init__(self) -> None:
        check_order(self)
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

    def encode(self, offset: int, epoch: int | None = None) -> int:
        return int(offset)

    def decode(self, value: Any) -> int:
        return min(int(value), self.size)

    def adopt(self, value: Any) -> int:
        """decode, where another process (a DALI source worker) takes up the position; a mix's order also
        takes the draws it carries (MixOrder.adopt)."""
        return self.decode(value)

    keys_are_records = property(lambda self: self.repeats == 1)  # else a key may stand for a record's copy

    def save(self, offset: int, epoch: int = 0) -> dict[str, Any]:
        """The position's part of a loader's state_dict, with the order it counts in."""
        return {"samples_done": int(offset), "order": ORDER}

    def restore(self, state: dict[str, Any]) -> int:
        """The position a state_dict saved (states from before positions were global count batches)."""
        refuse_mix_state(state)
        if "shard_position" in state:
            raise ValueError("cannot resume: the state was saved with sampling='shards', this loader samples "
                             "globally; resume with sampling='shards'")
        done = state.get("samples_done")
        if done is None:
            done = int(state["batches_done"]) * int(state["batch_size"]) * int(state["world_size"])
        refuse_another_order(state, self.decode(done) > 0, self.shuffle)
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

    def batches(self, epoch: int, offset: int = 0) -> Batches:
        """This rank's batches for `epoch` from global position `offset` on, each computed when it is
        asked for (`_batch`): a sequence of len num_batches(offset), nothing of the epoch held."""
        return Batches(self._batch_at(epoch, offset), range(self.num_batches(offset)))

    def _batch_at(self, epoch: int, offset: int) -> "RankBatch":
        keys = EpochKeys(self.size, seed=self.seed, epoch=epoch, shuffle=self.shuffle, repeats=self.repeats)
        count = self.num_batches(offset) * self.batch_size if self.drop_last else self.samples_per_rank(offset)
        return RankBatch(self, keys, min(offset, self.size), count)

    def rank_indices(self, epoch: int, offset: int = 0) -> np.ndarray:
        """This rank's keys for `epoch` from global position `offset`, in order, in one array (the
        rank's share: for tests and tools; a loader reads `batches`)."""
        parts = list(self.batches(epoch, offset))
        return np.concatenate(parts) if parts else np.empty(0, np.int64)


@dataclass(frozen=True)
class RankBatch:
    """Batch number -> its keys, from the positions alone. The rank's m-th sample from `start` on is
    the epoch's position start + rank + m x world; past the end of the epoch, padding wraps around to
    the start of its order, whatever the start, so a resumed epoch pads with the same samples as an
    unbroken one. `count`: the rank's samples (drop_last: whole batches only)."""

    order: EpochOrder
    keys: EpochKeys
    start: int
    count: int

    def __call__(self, number: int) -> np.ndarray:
        order, batch = self.order, self.order.batch_size
        m = np.arange(number * batch, min((number + 1) * batch, self.count), dtype=np.int64)
        j = order.shard.rank + m * order.shard.world_size  # this rank's places in the rest of the epoch
        rest = order.size - self.start
        return self.keys(np.where(j < rest, self.start + j, (j - rest) % order.size))


READ_AHEAD_SHARDS = 2  # shards a remote dataset's readers fetch ahead of the one they read
INTERLEAVE_SHARDS = 16  # ShardOrder.interleave_shards' default: shards one block interleaves (see ShardOrder)
MAX_INTERLEAVE_SHARDS = 10**9  # a saved state's value past this is not a shard count (MAX_SHARDS)
Segment = tuple[int, int]  # (world size, samples each rank consumed at that world size)


@dataclass(frozen=True)
class ShardOrder:
    """Shard-wise sampling for streamed data: each rank reads a contiguous piece of the epoch's
    shard-by-shard order, so it touches about shards/world shards (plus two it shares at its piece's
    ends) instead of every shard, and a node downloads only what its ranks read.

    Interleaving (when shuffling): a rank's piece is read in blocks of `interleave_shards` consecutive
    shards, each block interleaved (order.shardwise.InterleavedPiece), so a batch draws about equally from
    the block's shards instead of one or two: a dataset written class by class then gives batches about as balanced as a random
    permutation (tests/test_shard_mixing.py). Like Streaming's block shuffles (py1b, py1e) and
    webdataset's shuffle buffer over several open shards, memory stays bounded: a block's shards are
    all a rank reads at once, two blocks where one ends, and the next block's shards are fetched one
    by one while the current one is read (`shards_ahead`). Default 16: on shards written class by
    class (64 x 32 samples, 8 classes, 2 ranks, batches of 32) a batch's label histogram is then
    about 1.2x as far from the dataset's as under a random permutation (8 shards: 1.7x, shard by
    shard: 4.8x), while a rank's cache holds about 2 x 16 shards (0.5-8 GiB at this converter's
    16-256 MiB shards; `backends.shards_held`). Streaming's default block (2^18 samples) spans
    hundreds of shards; webdataset's usual 1,000-5,000-sample buffer draws from the one or two shards
    a worker has open. Bigger batches need more shards for the same balance. interleave_shards=1: shard by
    shard, as before.

    A position is the list of (world size, samples each rank consumed) segments of the epoch so far:
    the remainder is rebuilt by replaying them (each rank consumed a prefix of its mixed piece; what is
    left goes back to the epoch's shard-by-shard order), then dealt to the current ranks in equal
    contiguous pieces (padded from the start of the epoch's order, or trimmed with drop_last), each
    mixed with a key of (seed, epoch, segment, world, rank). Same world size: the exact continuation;
    another one: every remaining sample exactly once. The order, the rest and each rank's stream are
    computed, not stored (datapipe.order.shardwise): a rank holds the blocks it reads, never the epoch.
    """

    shard_sizes: tuple[int, ...]
    batch_size: int
    shard: Shard = Shard()
    seed: int = 0
    shuffle: bool = True
    drop_last: bool = False
    interleave_shards: int = INTERLEAVE_SHARDS

    start = ()

    def __post_init__(self) -> None:
        check_order(self)
        if not isinstance(self.interleave_shards, int) or self.interleave_shards < 1:
            raise ValueError(f"interleave_shards must be an int >= 1 (1: shard by shard), "
                             f"got {self.interleave_shards!r}")

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

    def encode(self, position: tuple[Segment, ...], epoch: int | None = None) -> list[list[int]]:
        return [[int(w), int(c)] for w, c in position]

    def decode(self, value: Any) -> tuple[Segment, ...]:
        return tuple((int(w), int(c)) for w, c in value)

    def adopt(self, value: Any) -> tuple[Segment, ...]:
        """decode, where another process (a DALI source worker) takes up the position."""
        return self.decode(value)

    keys_are_records = True

    def save(self, position: tuple[Segment, ...], epoch: int = 0) -> dict[str, Any]:
        """The position's part of a loader's state_dict (samples_done, padding included, for reports)."""
        return {"shard_position": self.encode(position), "interleave_shards": self.interleave_shards,
                "samples_done": sum(world * consumed for world, consumed in position), "order": ORDER}

    def restore(self, state: dict[str, Any]) -> tuple[Segment, ...]:
        refuse_mix_state(state)
        if "shard_position" not in state:
            if not state.get("samples_done") and not state.get("batches_done"):
                return ()
            raise ValueError("cannot resume: the state was saved with global sampling, this loader samples "
                             "shard-wise; resume with sampling='global'")
        position = self.decode(state["shard_position"])
        refuse_another_order(state, bool(position), self.shuffle)
        # "mix_shards": the key's name before #49; states from before interleaving read shard by shard
        key = "interleave_shards" if "interleave_shards" in state else "mix_shards"
        saved = state.get(key, 1)
        if type(saved) is not int or not 1 <= saved <= MAX_INTERLEAVE_SHARDS:
            raise ValueError(f"cannot resume: the state's {key} is {shown(saved)}, not a number of shards "
                             f"(1..{MAX_INTERLEAVE_SHARDS:,}); the state is damaged or not a datapipe loader's")
        if position and self.shuffle and saved != self.interleave_shards:
            log.warning("resuming mid-epoch from a state saved with interleave_shards=%d, this order interleaves %d: "
                        "the rest of epoch %s may repeat or miss some samples; the next epochs are exact", saved,
                        self.interleave_shards, state.get("epoch", "?"))
        return position

    @property
    def real_samples(self) -> int:
        if self.drop_last:
            return len(self) * self.batch_size
        piece = self._piece(self.size, self.shard.world_size)
        return max(0, min(piece, self.size - self.shard.rank * piece))

    def __len__(self) -> int:
        return self.num_batches(())

    def _mixing(self, epoch: int, segment: int, world: int, rank: int) -> int | None:
        """The key that mixes a rank's piece in a segment, None where pieces are read as they are."""
        if not self.shuffle or self.interleave_shards <= 1:
            return None
        return derive_key(self.seed, epoch, 2, segment, world, rank)

    def _stream(self, epoch: int, position: tuple[Segment, ...]) -> RankStream:
        """This rank's samples from `position`: the rest replayed through the segments (each rank
        consumed a prefix of its mixed piece; what is left goes back to the epoch's order), then dealt."""
        order = ShardwisePermutation(self.shard_sizes, seed=self.seed, epoch=epoch, shuffle=self.shuffle)
        segments, consumed = self._split(tuple(position))
        rest = Rest([range(order.size)])
        for k, (world, used) in enumerate(segments):
            piece = self._piece(len(rest), world)
            parts = [part for r in range(world) for part in InterleavedPiece(
                rest.slice(r * piece, (r + 1) * piece), order, self.interleave_shards,
                self._mixing(epoch, k, world, r)).unread(used)]
            rest = Rest(parts + (rest.slice(world * piece, len(rest)).parts if self.drop_last else []))
        world, rank = self.shard.world_size, self.shard.rank
        piece = self._piece(len(rest), world)
        real = max(0, min(piece, len(rest) - rank * piece))
        mixed = InterleavedPiece(rest.slice(rank * piece, rank * piece + real), order, self.interleave_shards,
                           self._mixing(epoch, len(segments), world, rank))
        padding = (np.arange(rank * piece + real, (rank + 1) * piece) - len(rest)) % order.size  # the order's start
        count = self.num_batches(position) * self.batch_size if self.drop_last else max(0, piece - consumed)
        lead = ((self.interleave_shards if self.shuffle else 1) - 1) * self.size // len(self.shard_sizes)
        return RankStream(order, mixed, padding, consumed=consumed, count=count, batch_size=self.batch_size, lead=lead)

    def batches(self, epoch: int, position: tuple[Segment, ...] = ()) -> Batches:
        """This rank's batches from `position` on, each computed when it is asked for (one mixing
        block at a time, the last few kept)."""
        return Batches(self._stream(epoch, position), range(self.num_batches(position)))

    def rank_indices(self, epoch: int, position: tuple[Segment, ...] = ()) -> np.ndarray:
        """This rank's records from `position`, in order, in one array (tests and tools)."""
        parts = list(self.batches(epoch, position))
        return np.concatenate(parts) if parts else np.empty(0, np.int64)

    def shards_ahead(self, batches: Batches, count: int) -> Batches:
        """Per batch of `batches` (this order's), computed when asked for: the shards it reads, then
        those to fetch ahead of a remote dataset's readers: the next `count` shards this rank has not
        read yet, and, when mixing, each shard from interleave_shards - 1 shards' worth of samples before it
        would start in the unmixed order, so the next block's shards are fetched one by one while the
        current block is read."""
        return Batches(partial(batches.source.hint, count), batches.numbers)

    def shard_of(self, indices: np.ndarray) -> np.ndarray:
        first = np.concatenate([[0], np.cumsum(self.shard_sizes)])
        return np.searchsorted(first, indices, side="right") - 1
