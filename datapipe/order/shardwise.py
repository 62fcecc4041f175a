"""Shard-wise sampling's order computed, not stored (sharding.ShardOrder deals it): the epoch's
shard-by-shard order as a function of position, what is left of an epoch after elastic segments as
ranges and small arrays of positions, and a rank's stream of batches and read-ahead hints, computed
one mixing block at a time.

Memory: the shards' tables (O(shards)), the few blocks in flight (interleave_shards shards' samples each)
and, after an elastic resume, one partly read block per rank of each earlier world size; never an
array of the epoch's samples.
"""
from __future__ import annotations

from collections import OrderedDict

import numpy as np

from .permutation import Permutation, derive_key, uniform

BLOCKS_KEPT = 4  # mixed blocks a stream keeps: the one read and the next ones its read-ahead hints look at


class ShardwisePermutation:
    """Position -> record in the epoch's shard-by-shard order: the shards in a permutation keyed by
    (seed, epoch) ("slots"), each shard's records in a permutation of their own; unshuffled, the
    stored order. Records of shard k are numbered contiguously, as in the dataset."""

    def __init__(self, sizes: tuple[int, ...], *, seed: int, epoch: int, shuffle: bool) -> None:
        stored = np.asarray(sizes, dtype=np.int64)
        self.size = int(stored.sum())
        self.first = np.r_[0, np.cumsum(stored)]  # where each shard's records start in the dataset
        self.key = derive_key(seed, epoch, 1) if shuffle else None
        count = len(stored)
        self.slot_shard = Permutation(count, self.key)(np.arange(count)) if shuffle else np.arange(count)
        self.sizes = stored[self.slot_shard]  # per slot
        self.starts = np.r_[0, np.cumsum(self.sizes)]  # the positions of slot s: starts[s]..starts[s + 1]

    def slot(self, positions: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.starts, positions, side="right") - 1

    def shards(self, positions: np.ndarray) -> np.ndarray:
        """The dataset shard each position reads."""
        return self.slot_shard[self.slot(positions)]

    def records(self, positions: np.ndarray) -> np.ndarray:
        positions = np.asarray(positions, dtype=np.int64)
        if self.key is None:
            return positions
        slots = self.slot(positions)
        out = np.empty_like(positions)
        for slot in np.unique(slots):
            where, shard = slots == slot, int(self.slot_shard[slot])
            within = Permutation(int(self.sizes[slot]), derive_key(self.key, shard))
            out[where] = self.first[shard] + within(positions[where] - self.starts[slot])
        return out


class Rest:
    """A sorted sequence of order positions held as ranges and arrays: what is left of an epoch."""

    def __init__(self, parts: list) -> None:
        self.parts = [p for p in parts if len(p)]
        self.bounds = np.cumsum([0] + [len(p) for p in self.parts])

    def __len__(self) -> int:
        return int(self.bounds[-1])

    def slice(self, i: int, j: int) -> "Rest":
        spans = zip(self.parts, self.bounds[:-1].tolist())
        return Rest([p[max(i - lo, 0):max(j - lo, 0)] for p, lo in spans if i - lo < len(p) and j > lo])

    def take(self, i: int, j: int) -> np.ndarray:
        """Positions i..j of the sequence, in one array."""
        taken = [np.arange(p.start, p.stop) if isinstance(p, range) else p for p in self.slice(i, j).parts]
        return np.concatenate(taken) if taken else np.empty(0, np.int64)

    def runs(self, order: ShardwisePermutation) -> tuple[np.ndarray, np.ndarray]:
        """(where each run starts, its slot): a run is the sequence's positions in one shard (one run
        per shard: the positions are sorted, a shard's are contiguous)."""
        starts, slots = [np.empty(0, np.int64)], [np.empty(0, np.int64)]
        for part, offset in zip(self.parts, self.bounds[:-1].tolist()):
            if isinstance(part, range):
                spanned = np.arange(order.slot(part.start), order.slot(part.stop - 1) + 1)
                spanned = spanned[order.sizes[spanned] > 0]
                starts.append(np.maximum(order.starts[spanned], part.start) - part.start + offset)
                slots.append(spanned)
            else:
                slot = order.slot(part)
                change = np.r_[True, slot[1:] != slot[:-1]]
                starts.append(np.flatnonzero(change) + offset)
                slots.append(slot[change])
        start, slot = np.concatenate(starts), np.concatenate(slots)
        new = np.r_[True, slot[1:] != slot[:-1]][:len(slot)]  # a run may go on from one part into the next
        return start[new], slot[new]


class InterleavedPiece:
    """A rank's piece of the rest (real samples) in reading order, one block at a time: blocks of at
    most `mix` consecutive runs, as few and as even as can be (no small last block), each interleaved:
    sample j of a run of n goes to (j + u) / n of the way through its block (u uniform, keyed by
    `key` and its place in the piece), so any stretch of a block draws about equally from all of its
    shards, in a random order. Blocks keep their place. key None: the piece as it is."""

    def __init__(self, rest: Rest, order: ShardwisePermutation, mix: int, key: int | None) -> None:
        self.rest, self.order, self.key = rest, order, key
        self.run_starts, self.run_slots = rest.runs(order)
        runs = len(self.run_starts)
        blocks = -(-runs // max(mix, 1))
        first_runs = -(-np.arange(blocks, dtype=np.int64) * runs // max(blocks, 1))  # run k is in block k*blocks//runs
        self.block_runs = np.r_[first_runs, runs]  # block b holds runs block_runs[b]..block_runs[b + 1]
        self.block_starts = np.r_[self.run_starts[first_runs], len(rest)]
        self._kept: OrderedDict[tuple[int, bool], np.ndarray] = OrderedDict()

    def __len__(self) -> int:
        return len(self.rest)

    def block_of(self, index: int) -> int:
        return int(np.searchsorted(self.block_starts, index, side="right")) - 1

    def block(self, b: int, records: bool = False) -> np.ndarray:
        """Block b's positions in reading order, or their records (the last few blocks' kept)."""
        key = (b, records)
        if key in self._kept:
            self._kept.move_to_end(key)
            return self._kept[key]
        made = self.order.records(self.block(b)) if records else self._mixed(b)
        self._kept[key] = made
        if len(self._kept) > 2 * BLOCKS_KEPT:
            self._kept.popitem(last=False)
        return made

    def _mixed(self, b: int) -> np.ndarray:
        lo, hi = int(self.block_starts[b]), int(self.block_starts[b + 1])
        positions = self.rest.take(lo, hi)
        if self.key is not None and hi - lo > 1:
            index = np.arange(lo, hi)
            starts = self.run_starts[self.block_runs[b]:self.block_runs[b + 1]]
            run = np.searchsorted(starts, index, side="right") - 1
            lengths = np.diff(np.r_[starts, hi])
            place = (index - starts[run] + uniform(index, self.key)) / lengths[run]
            positions = positions[np.argsort(place, kind="stable")]
        return positions

    def take(self, i: int, j: int, records: bool = False) -> np.ndarray:
        """Positions i..j of the piece in reading order, or their records."""
        parts, b = [np.empty(0, np.int64)], self.block_of(i)
        while i < j:
            lo, hi = int(self.block_starts[b]), int(self.block_starts[b + 1])
            parts.append(self.block(b, records)[i - lo:min(j, hi) - lo])
            i, b = min(j, hi), b + 1
        return np.concatenate(parts)

    def unread(self, used: int) -> list:
        """The rest's parts left after the first `used` samples in reading order, in position order."""
        if used >= len(self):
            return []
        if self.key is None or used == 0:
            return self.rest.slice(used, len(self)).parts
        b = self.block_of(used)
        lo, hi = int(self.block_starts[b]), int(self.block_starts[b + 1])
        if used == lo:
            return self.rest.slice(lo, len(self)).parts
        return [np.sort(self.block(b)[used - lo:])] + self.rest.slice(hi, len(self)).parts


class RankStream:
    """One rank's samples from a position on: its mixed piece from `consumed` on, then its padding
    (positions from the start of the epoch's order), `count` in all; batch n's records and its
    read-ahead hint (sharding.ShardOrder.shards_ahead), each computed when asked for."""

    def __init__(self, order: ShardwisePermutation, piece: InterleavedPiece, padding: np.ndarray, *, consumed: int,
                 count: int, batch_size: int, lead: int) -> None:
        self.order, self.piece, self.padding = order, piece, padding
        self.consumed, self.count, self.batch_size, self.lead = consumed, count, batch_size, lead
        self.real = max(0, min(count, len(piece) - consumed))  # stream 0..real: the piece; then padding
        self._groups: Groups | None = None

    def positions(self, i: int, j: int, records: bool = False) -> np.ndarray:
        """Stream samples i..j as order positions, or their records."""
        real = self.piece.take(self.consumed + i, self.consumed + min(j, self.real), records)
        if j <= self.real:
            return real
        skip = self.consumed - len(self.piece)  # stream sample s >= real is padding sample s + skip
        pad = self.padding[max(i, self.real) + skip:j + skip]
        return np.concatenate([real, self.order.records(pad) if records else pad])

    def _span(self, number: int) -> tuple[int, int]:
        begin = number * self.batch_size
        return begin, min(begin + self.batch_size, self.count)

    def __call__(self, number: int) -> np.ndarray:
        """Batch `number`'s records."""
        return self.positions(*self._span(number), records=True)

    def hint(self, count: int, number: int) -> tuple[int, ...]:
        """The shards batch `number` reads, then those to fetch ahead: the next `count` shards the
        stream has not read yet, and each shard that would start within `lead` samples past the
        batch's end were the blocks not mixed (its samples counted in first-read order)."""
        if self._groups is None:
            self._groups = Groups(self)
        begin, end = self._span(number)
        read = self.order.shards(self.positions(begin, end))
        own = read[np.sort(np.unique(read, return_index=True)[1])]
        new = self._groups.first_before(end)
        upto = max(new + count, self._groups.unmixed_before(end + self.lead))
        return tuple(int(s) for s in own) + self._groups.entries(new, upto)


class Groups:
    """The shards of a stream in first-read order, group by group (each mixing block the stream reads,
    then its padding), each group's order computed when a hint needs it: its shards, where each is
    first read and how many of its samples the stream holds (padding ones included)."""

    def __init__(self, stream: RankStream) -> None:
        self.stream, piece = stream, stream.piece
        lo, hi = stream.consumed, stream.consumed + stream.real  # the stream's piece indices
        self.blocks = list(range(piece.block_of(lo), piece.block_of(hi - 1) + 1)) if hi > lo else []
        edges = [min(max(int(piece.block_starts[b]), lo), hi) - lo for b in self.blocks] + [stream.real]
        self.windows = list(zip(edges[:-1], edges[1:]))  # each block's stream range
        self.group_starts = np.array(edges, dtype=np.int64)  # where each group (the padding last) starts
        self._schedules: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        pad = stream.positions(stream.real, stream.count)
        self.extra, pad_shards = self._padding_in_blocks(pad)
        shards, first = np.unique(pad_shards, return_index=True)
        by_first = np.argsort(first)
        counts = np.bincount(np.searchsorted(shards, pad_shards), minlength=len(shards))
        padding_group = (shards[by_first], first[by_first] + stream.real, counts[by_first])
        sizes = [self._entries(g) for g in range(len(self.blocks))] + [len(padding_group[0])]
        totals = [w[1] - w[0] + sum(self.extra.get(g, {}).values()) for g, w in enumerate(self.windows)]
        self._schedules[len(self.blocks)] = padding_group
        self.entry_bounds = np.cumsum([0] + sizes)
        self.count_bounds = np.cumsum([0] + totals + [len(pad_shards)])

    def _padding_in_blocks(self, pad: np.ndarray) -> tuple[dict[int, dict[int, int]], np.ndarray]:
        """({group: {shard: padding samples}} for padding in a shard that a block of the stream reads,
        the other padding samples' shards): padding is under world_size samples."""
        extra: dict[int, dict[int, int]] = {}
        others, members = [], {}
        for shard, slot in zip(self.stream.order.shards(pad).tolist(), self.stream.order.slot(pad).tolist()):
            group = self._group_of(slot)
            if group is not None and shard in members.setdefault(group, self._shards_in(group)):
                extra.setdefault(group, {})
                extra[group][shard] = extra[group].get(shard, 0) + 1
            else:
                others.append(shard)
        return extra, np.array(others, dtype=np.int64)

    def _group_of(self, slot: int) -> int | None:
        """The group of the block whose runs hold `slot`, if the stream reads that block."""
        piece = self.stream.piece
        run = int(np.searchsorted(piece.run_slots, slot))
        if run == len(piece.run_slots) or piece.run_slots[run] != slot:
            return None
        b = int(np.searchsorted(piece.block_runs, run, side="right")) - 1
        return b - self.blocks[0] if self.blocks and self.blocks[0] <= b <= self.blocks[-1] else None

    def _shards_in(self, group: int) -> set[int]:
        lo, hi = self.windows[group]
        return set(self.stream.order.shards(self.stream.positions(lo, hi)).tolist())

    def _entries(self, group: int) -> int:
        """How many shards a block of the stream reads (a whole block: its runs, without mixing it)."""
        b, (lo, hi) = self.blocks[group], self.windows[group]
        piece = self.stream.piece
        if hi - lo == int(piece.block_starts[b + 1] - piece.block_starts[b]):
            return int(piece.block_runs[b + 1] - piece.block_runs[b])
        return len(self.schedule(group)[0])

    def schedule(self, group: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(shards in first-read order, their first stream index, their samples in the stream)."""
        if group not in self._schedules:
            lo, hi = self.windows[group]
            shards = self.stream.order.shards(self.stream.positions(lo, hi))
            found, first, counts = np.unique(shards, return_index=True, return_counts=True)
            by_first = np.argsort(first)
            extra = self.extra.get(group, {})
            counts = counts + np.array([extra.get(int(s), 0) for s in found], dtype=np.int64)
            self._schedules[group] = (found[by_first], first[by_first] + lo, counts[by_first])
        return self._schedules[group]

    def first_before(self, end: int) -> int:
        """How many shards the stream first reads before sample `end`."""
        group = int(np.searchsorted(self.group_starts, end, side="right")) - 1
        if group < 0:
            return 0
        return int(self.entry_bounds[group]) + int(np.searchsorted(self.schedule(group)[1], end))

    def unmixed_before(self, end: int) -> int:
        """How many shards would start before sample `end` were the blocks not mixed."""
        group = int(np.searchsorted(self.count_bounds, end, side="left")) - 1
        if group >= len(self.entry_bounds) - 1:
            return int(self.entry_bounds[-1])
        if group < 0:
            return 0
        counts = self.schedule(group)[2]
        starts = self.count_bounds[group] + np.r_[0, np.cumsum(counts)[:-1]]
        return int(self.entry_bounds[group]) + int(np.searchsorted(starts, end))

    def entries(self, i: int, j: int) -> tuple[int, ...]:
        """Shards i..j in first-read order."""
        j = min(j, int(self.entry_bounds[-1]))
        out: list[int] = []
        while i < j:
            group = int(np.searchsorted(self.entry_bounds, i, side="right")) - 1
            shards, start = self.schedule(group)[0], int(self.entry_bounds[group])
            taken = shards[i - start:j - start].tolist()
            out += taken
            i += len(taken)
        return tuple(out)
