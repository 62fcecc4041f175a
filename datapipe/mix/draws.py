"""A mix's epoch in closed form: how many samples each source gives (exact), where in the epoch they
stand (spread evenly, locally random), and which record each draw reads, from (seed, epoch, position)
and the draws each source gave before this epoch. No array of the epoch, no per-draw state.

- `apportion`: per-source counts of an epoch, weights x epoch_size rounded by largest remainder
  (Hamilton's method, exact rationals; ties to the earlier source), so they sum to the epoch size.
- `locate`: position -> (source, its draw number in this epoch) by halving the epoch log2(N) times.
  Each half gets half of every source's count; where a count is odd, which half gets the extra one
  is drawn (keyed by the node), so over any aligned block each source is within one sample of its
  share, and any window of the epoch within about 2 log2(window) of it (tests/test_mix_draws.py).
  O(log N x sources) per position, vectorised over a batch of positions.
- `SourceStream`: a source read as an endless stream of its own keyed permutations (cycle k keyed
  by (seed, source name, k)): draw g is record perm_(g // n)(g % n), so every record comes once
  before any comes twice, whatever the epochs' counts.
"""
from __future__ import annotations

import hashlib
from collections.abc import Sequence
from fractions import Fraction
from functools import lru_cache

import numpy as np

from ..order.permutation import Permutation, derive_key, uniform
from ..order.shardwise import ShardwisePermutation

MIX_TAG, STREAM_TAG = 3, 4  # derive_key's stream numbers for the mix's halving and its sources' cycles


def apportion(weights: Sequence[float], total: int) -> tuple[int, ...]:
    """`total` split in proportion to `weights` (non-negative, not all 0): floors of the exact quotas,
    then one more each to the largest remainders (the earlier source first on a tie)."""
    exact = [Fraction(w) for w in weights]
    whole = sum(exact)
    quotas = [total * w / whole for w in exact]
    counts = [int(q) for q in quotas]  # floor: quotas are >= 0
    order = sorted(range(len(quotas)), key=lambda s: (-(quotas[s] - counts[s]), s))
    for s in order[: total - sum(counts)]:
        counts[s] += 1
    return tuple(counts)


def name_key(name: str) -> int:
    """A source's name as a 64-bit integer (its streams are keyed by name, not by its place in the mix)."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little")


@lru_cache(maxsize=64)
def _level_keys(key: int, depth: int) -> tuple[int, ...]:
    return tuple(derive_key(key, MIX_TAG, level) for level in range(depth))


def locate(counts: Sequence[int], positions: np.ndarray, key: int | None) -> tuple[np.ndarray, np.ndarray]:
    """(source, draw number within the epoch) of each position of an epoch of sum(counts) samples.
    `key` draws which half takes an odd count's extra sample; None: the first half, always (an
    unshuffled mix: the same pattern every epoch)."""
    counts = np.asarray(counts, dtype=np.int64)
    size, sources = int(counts.sum()), len(counts)
    p = np.asarray(positions, dtype=np.int64).reshape(-1)
    if p.size and (p.min() < 0 or p.max() >= size):
        raise ValueError(f"positions must lie in [0, {size}), got {int(p.min())}..{int(p.max())}")
    lo = np.zeros(p.size, np.int64)
    length = np.full(p.size, size, np.int64)
    c = np.broadcast_to(counts, (p.size, sources)).copy()
    before = np.zeros((p.size, sources), np.int64)
    ids = np.arange(sources, dtype=np.int64)
    keys = _level_keys(key, max(1, size - 1).bit_length()) if key is not None else None
    level = 0
    while (length > 1).any():
        half = length // 2
        left = c // 2
        odd = (c % 2).astype(bool)
        need = half - left.sum(axis=1)  # extras the first half takes: 0..(odd sources)
        if keys is None:
            score = np.where(odd, ids, sources).astype(np.float64)
        else:
            score = np.where(odd, uniform(lo[:, None] * sources + ids, keys[level]), 2.0)
        rank = np.argsort(np.argsort(score, axis=1, kind="stable"), axis=1, kind="stable")
        left = left + (odd & (rank < need[:, None]))
        right = p >= lo + half
        active = length > 1
        go = (right & active)[:, None]
        before = np.where(go, before + left, before)
        c = np.where(go, c - left, np.where(active[:, None], left, c))
        lo = np.where(right & active, lo + half, lo)
        length = np.where(active, np.where(right, length - half, half), length)
        level += 1
    source = np.argmax(c, axis=1)
    return source, before[np.arange(p.size), source]


class SourceStream:
    """One source as an endless stream of keyed permutations of its `size` records: draw g reads
    record perm_k(g mod size), k = g // size (unshuffled: record g mod size)."""

    def __init__(self, size: int, *, seed: int, name: str, shuffle: bool) -> None:
        self.size, self.shuffle = int(size), shuffle
        self._key = derive_key(seed, STREAM_TAG, name_key(name))
        self._cycles: dict[int, Permutation] = {}

    def _permutation(self, cycle: int) -> Permutation:
        perm = self._cycles.get(cycle)
        if perm is None:
            if len(self._cycles) > 8:
                self._cycles.clear()
            perm = self._cycles[cycle] = Permutation(self.size, derive_key(self._key, cycle))
        return perm

    def records(self, draws: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(record, cycle) of each draw number (int64 arrays of draws' shape)."""
        draws = np.asarray(draws, dtype=np.int64)
        cycle, at = np.divmod(draws, self.size)
        if not self.shuffle:
            return at, cycle
        out = np.empty_like(at)
        for k in np.unique(cycle):
            where = cycle == k
            out[where] = self._permutation(int(k))(at[where])
        return out, cycle


class ShardStream(SourceStream):
    """A sharded source (a remote .wds) as an endless stream that reads shard by shard: cycle k's shards
    in an order keyed by (seed, name, k), each shard's records permuted (order.shardwise.ShardwisePermutation),
    the draws of each block of `interleave_shards` consecutive shards interleaved, so the mix reads a few shards
    of the source at a time (what a node's cache holds), each once a cycle. Unshuffled: the stored order."""

    def __init__(self, shard_sizes: Sequence[int], *, seed: int, name: str, shuffle: bool,
                 interleave_shards: int) -> None:
        sizes = tuple(int(n) for n in shard_sizes)
        super().__init__(sum(sizes), seed=seed, name=name, shuffle=shuffle)
        self.shard_sizes, self.interleave_shards = sizes, interleave_shards
        self._orders: dict[int, tuple[ShardwisePermutation, np.ndarray]] = {}

    def _order(self, cycle: int) -> tuple[ShardwisePermutation, np.ndarray]:
        """Cycle `cycle`'s shard-by-shard order and where its blocks of interleave_shards shards start."""
        found = self._orders.get(cycle)
        if found is None:
            if len(self._orders) > 2:
                self._orders.clear()
            order = ShardwisePermutation(self.shard_sizes, seed=self._key, epoch=cycle, shuffle=self.shuffle)
            found = self._orders[cycle] = (order, np.r_[order.starts[:-1:self.interleave_shards], order.size])
        return found

    def records(self, draws: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        draws = np.asarray(draws, dtype=np.int64)
        cycle, at = np.divmod(draws, self.size)
        out = np.empty_like(at)
        for k in np.unique(cycle):
            where = cycle == k
            order, blocks = self._order(int(k))
            positions = at[where]
            if self.shuffle and self.interleave_shards > 1:
                block = np.searchsorted(blocks, positions, side="right") - 1
                for b in np.unique(block):
                    inside = block == b
                    start, end = int(blocks[b]), int(blocks[b + 1])
                    mixing = Permutation(end - start, derive_key(self._key, int(k), int(b)))
                    positions[inside] = start + mixing(positions[inside] - start)
            out[where] = order.records(positions)
        return out, cycle

    def shards(self, draws: np.ndarray) -> np.ndarray:
        """The shard each draw reads (the tests check a stream's draws stay within its window with it)."""
        records, _ = self.records(draws)
        first = np.r_[0, np.cumsum(self.shard_sizes)]
        return np.searchsorted(first, records, side="right") - 1
