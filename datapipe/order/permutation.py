"""The epoch order computed, not stored: a keyed pseudo-random permutation of [0, size) that maps
any position to its record in O(1) time and memory, and a rank's batches computed from it on demand.

`Permutation(size, key)` is a Feistel network over the smallest power-of-two domain that holds
`size` (its bits split in two halves, the halves' widths alternating round by round when the bit
count is odd), each round keyed by a splitmix64 hash of the half and a round key derived from
`key`; a value that lands past `size` is sent through the network again until it falls inside
(cycle-walking), which keeps a bijection on [0, size). The idea is Grain's global shuffle
(grain/_src/python/experimental/index_shuffle: a Simon-style cipher over an even block of at least
16 bits, 4 rounds or more); this code is our own, numpy only. Alternating widths keep the domain
under 2 x size where an even block can reach 4 x size (and 2^16 for any small size).

Cost: a position passes through the network fewer than 2 times on average (domain / size), and,
were the network an ideal random permutation, more than k times with a probability below 2^-k. The
walk always ends: the cycle through a position of [0, size) returns to it, so it is at most
domain - size + 1 passes long (measured worst over 10^6 positions: 21 passes at size 2^20 + 1,
tools/order_bench.py).
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import overload

import numpy as np

ROUNDS = 8  # Feistel rounds: 4 (Luby-Rackoff's bound) leave small domains measurably biased (tests/test_order.py)
MASK64 = (1 << 64) - 1
GAMMA = 0x9E3779B97F4A7C15  # splitmix64's increment (the golden ratio)
MIX1, MIX2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)  # splitmix64's finalizer
S30, S27, S31 = np.uint64(30), np.uint64(27), np.uint64(31)


def hash64(value: int) -> int:
    """splitmix64's finalizer on one 64-bit value: every output bit depends on every input bit."""
    z = value & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def derive_key(*parts: int) -> int:
    """One 64-bit key from integers of any size (seed, epoch, a stream number, ...): each 64-bit word of
    each part mixed in turn, the parts' count last, so (1, 2) and (1, 2, 0) differ."""
    h = GAMMA
    for part in parts:
        part = int(part)
        while True:
            h = hash64(h + GAMMA + (part & MASK64))
            part >>= 64
            if part in (0, -1):
                break
    return hash64(h + len(parts))


def _round(half: np.ndarray, key: np.uint64) -> np.ndarray:
    """The round function: splitmix64's finalizer of the half offset by the round key (uint64, wrapping)."""
    z = half + key
    z = (z ^ (z >> S30)) * MIX1
    z = (z ^ (z >> S27)) * MIX2
    return z ^ (z >> S31)


def uniform(indices: np.ndarray, key: int) -> np.ndarray:
    """A uniform float in [0, 1) per index, keyed: the same index and key, the same number, anywhere."""
    z = _round(np.asarray(indices).astype(np.uint64).reshape(-1), np.uint64(key & MASK64))
    return ((z >> np.uint64(11)).astype(np.float64) * 2.0**-53).reshape(np.shape(indices))


class Permutation:
    """A pseudo-random bijection of [0, size) keyed by `key`: `perm(positions)` gives the value at each
    position (vectorised), `perm.inverse(values)` the positions; any element in O(1) time and memory."""

    __slots__ = ("size", "key", "bits", "_rounds")

    def __init__(self, size: int, key: int) -> None:
        if int(size) < 1:
            raise ValueError(f"a permutation needs size >= 1, got {size}")
        self.size, self.key = int(size), int(key) & MASK64
        self.bits = (self.size - 1).bit_length()  # the domain: [0, 2**bits), 2**bits < 2 * size
        self._rounds = tuple(self._round_constants(r) for r in range(ROUNDS))

    def _round_constants(self, r: int) -> tuple[np.uint64, ...]:
        """Round r's key, and its split of x into a high half and a low half of `low` bits (the widths
        alternate round by round): (key, low, high, low mask, high mask) as uint64."""
        low = self.bits // 2 if r % 2 == 0 else self.bits - self.bits // 2
        high = self.bits - low
        return tuple(np.uint64(v) for v in (derive_key(self.key, r), low, high, (1 << low) - 1, (1 << high) - 1))

    def _forward(self, x: np.ndarray) -> np.ndarray:
        """One pass through the network over the whole domain: (high, low) -> (low, high ^ F(low))."""
        for key, low, high, low_mask, high_mask in self._rounds:
            right = x & low_mask
            x = (right << high) | ((x >> low) ^ (_round(right, key) & high_mask))
        return x

    def _backward(self, y: np.ndarray) -> np.ndarray:
        """The inverse of `_forward`, the rounds undone in reverse order."""
        for key, low, high, low_mask, high_mask in reversed(self._rounds):
            right = y >> high
            y = (((y & high_mask) ^ (_round(right, key) & high_mask)) << low) | right
        return y

    def _walk(self, values: np.ndarray, step: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
        """`step` applied until every value is below size (cycle-walking), only to those still outside."""
        x = np.asarray(values)
        if x.size and (int(x.min()) < 0 or int(x.max()) >= self.size):
            raise ValueError(f"positions must lie in [0, {self.size}), got {int(x.min())}..{int(x.max())}")
        if self.bits == 0:
            return np.zeros(x.shape, np.int64)
        out = step(x.astype(np.uint64).reshape(-1))  # 1-d: numpy scalars would warn on the wrapping
        todo = np.flatnonzero(out >= self.size)
        while todo.size:
            moved = step(out[todo])
            out[todo] = moved
            todo = todo[moved >= self.size]
        return out.astype(np.int64).reshape(x.shape)

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        """The values at `positions` (int64, the same shape)."""
        return self._walk(positions, self._forward)

    def inverse(self, values: np.ndarray) -> np.ndarray:
        """The positions holding `values`: where in the order each record stands."""
        return self._walk(values, self._backward)

    def __repr__(self) -> str:
        return f"Permutation(size={self.size}, key={self.key:#x})"


class Batches(Sequence):
    """A rank's batches of one epoch, each computed from its positions when it is asked for: `len`,
    `[i]`, `[a:b]` (another such sequence) and iteration, never a list of the epoch held at once.
    `batch(n)` makes batch n; it must pickle where the sequence does (a bound method of an epoch order does)."""

    def __init__(self, batch: Callable[[int], np.ndarray], numbers: range) -> None:
        self._batch, self._numbers = batch, numbers

    @property
    def source(self) -> Callable[[int], np.ndarray]:
        """What makes each batch (a ShardOrder's stream answers more about it: sharding.ShardOrder.shards_ahead)."""
        return self._batch

    @property
    def numbers(self) -> range:
        """The batch numbers this sequence holds, in order."""
        return self._numbers

    def __len__(self) -> int:
        return len(self._numbers)

    @overload
    def __getitem__(self, item: int) -> np.ndarray: ...

    @overload
    def __getitem__(self, item: slice) -> "Batches": ...

    def __getitem__(self, item):
        if isinstance(item, slice):
            return Batches(self._batch, self._numbers[item])
        return self._batch(self._numbers[item])  # range: negative indices, IndexError past the end

    def __iter__(self) -> Iterator[np.ndarray]:
        return map(self._batch, self._numbers)

    def __repr__(self) -> str:
        return f"Batches({len(self)} batches, numbers {self._numbers.start}..{self._numbers.stop})"
