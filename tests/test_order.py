"""The computed epoch order (datapipe.order.permutation): a bijection of [0, N) for every N, the same for the same
key, uniform positions, consecutive epochs and neighbouring positions uncorrelated; and EpochOrder's
lazy batches are exactly the interleaved, padded, trimmed slices of that order."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from datapipe.order.permutation import Batches, Permutation, derive_key
from datapipe.order.sharding import EpochKeys, EpochOrder, Shard


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rho of two orderings of the same values (their ranks are their values' ranks)."""
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


def chi_square(counts: np.ndarray) -> tuple[float, int]:
    """(statistic, degrees of freedom) of counts against a uniform expectation."""
    expected = counts.sum() / counts.size
    return float(((counts - expected) ** 2 / expected).sum()), counts.size - 1


def below_tail(statistic: float, dof: int, z: float = 3.3) -> bool:
    """The statistic below the chi-square's upper 0.05% tail (Wilson-Hilferty normal approximation)."""
    k = 2 / (9 * dof)
    return (statistic / dof) ** (1 / 3) < 1 - k + z * k ** 0.5


@pytest.mark.parametrize("size", [1, 2, 3, 7, 64, 65, 1000, 2**20, 1_000_003])
def test_a_bijection_of_every_size_and_its_inverse(size):
    for key in (0, 12345, derive_key(7, 3))[: 1 if size > 10**5 else 3]:
        perm = Permutation(size, key)
        values = perm(np.arange(size))
        assert values.dtype == np.int64 and np.array_equal(np.sort(values), np.arange(size))
        assert np.array_equal(perm.inverse(values), np.arange(size))


def test_a_bijection_at_ten_million_and_on_a_sample_of_a_hundred_million():
    size = 10**7
    seen = np.zeros(size, dtype=bool)
    perm = Permutation(size, derive_key(1, 0))
    for start in range(0, size, 2_500_000):  # in chunks: the test holds a bitmap, not the order
        seen[perm(np.arange(start, start + 2_500_000))] = True
    assert seen.all()
    size = 10**8
    perm = Permutation(size, derive_key(1, 0))
    positions = np.r_[0, 1, size - 1, np.random.default_rng(0).choice(size, 500_000, replace=False)]
    values = perm(positions)
    assert values.min() >= 0 and values.max() < size and len(np.unique(values)) == len(positions)
    assert np.array_equal(perm.inverse(values), positions)
    assert int(perm(np.int64(size - 1))) == values[2]  # one position alone: the same value, a 0-d array


def test_the_same_key_the_same_order_another_seed_or_epoch_another_order():
    def order(seed, epoch):
        return EpochKeys(1000, seed=seed, epoch=epoch, shuffle=True)(np.arange(1000))

    assert np.array_equal(order(3, 0), order(3, 0))
    assert not np.array_equal(order(3, 0), order(4, 0)) and not np.array_equal(order(3, 0), order(3, 1))
    assert derive_key(1, 2) != derive_key(2, 1) and derive_key(1, 2) != derive_key(1, 2, 0)
    assert derive_key(2**70 + 5) != derive_key(5)  # a seed past 64 bits is mixed whole
    assert np.array_equal(EpochKeys(9, seed=3, epoch=0, shuffle=False)(np.arange(9)), np.arange(9))


@pytest.mark.parametrize("size,keys", [(5, 1000), (10, 2000), (33, 2000)])
def test_every_record_lands_on_every_position_equally_often_across_keys(size, keys):
    """The full position x record table over many keys is uniform: small domains are where a Feistel
    network with too few rounds shows (4 rounds fail this at sizes 5 and 10; datapipe.order.permutation.ROUNDS)."""
    table = np.zeros((size, size), dtype=np.int64)
    for key in range(keys):
        table[np.arange(size), Permutation(size, derive_key(9, key))(np.arange(size))] += 1
    statistic, _ = chi_square(table)
    assert below_tail(statistic, (size - 1) ** 2), statistic


def test_any_stretch_of_an_epoch_draws_uniformly_from_the_whole_dataset():
    size, bins = 10**6, 100
    perm = Permutation(size, derive_key(5, 2))
    for start in (0, 123_457, size - 50_000):  # the epoch's start, its middle, its end
        records = perm(np.arange(start, start + 50_000))
        statistic, dof = chi_square(np.bincount(records * bins // size, minlength=bins))
        assert below_tail(statistic, dof), (start, statistic)


def test_consecutive_epochs_and_neighbouring_positions_are_uncorrelated():
    size = 10**5
    orders = [EpochKeys(size, seed=11, epoch=e, shuffle=True)(np.arange(size)) for e in range(4)]
    for a, b in zip(orders, orders[1:]):
        assert abs(spearman(a, b)) < 0.02
    for order in orders:
        assert abs(spearman(order[:-1], order[1:])) < 0.02  # position i and i + 1
        where = np.argsort(order)
        assert abs(spearman(where[:-1], where[1:])) < 0.02  # record r and r + 1


def reference_batches(order: EpochOrder, epoch: int, offset: int) -> list[np.ndarray]:
    """The order's batches as they were sliced when it was stored: the whole order materialised, the
    rest from `offset` padded from the order's start, the rank's interleaved slice, trimmed, cut."""
    stored = EpochKeys(order.size, seed=order.seed, epoch=epoch, shuffle=order.shuffle,
                       repeats=order.repeats)(np.arange(order.size))
    world, rest = order.shard.world_size, stored[min(offset, order.size):]
    total = order.samples_per_rank(offset) * world
    if total > len(rest):
        rest = np.concatenate([rest, np.resize(stored, total - len(rest))])
    mine = rest[order.shard.rank:total:world]
    mine = mine[: order.num_batches(offset) * order.batch_size] if order.drop_last else mine
    return [mine[i:i + order.batch_size] for i in range(0, len(mine), order.batch_size)]


def test_the_lazy_batches_are_the_stored_orders_slices_with_padding_drop_last_and_repeats():
    cases = 0
    for size, world, batch, drop_last, repeats in itertools.product(
            [1, 17, 101], [1, 3, 7], [1, 6], [False, True], [1, 3]):
        for rank in range(world):
            if drop_last and size // world < batch:
                continue
            order = EpochOrder(size, batch, Shard(rank, world), seed=4, drop_last=drop_last, repeats=repeats)
            for offset in (0, 5, size // 2, size):
                got, want = order.batches(2, offset), reference_batches(order, 2, offset)
                assert isinstance(got, Batches) and len(got) == len(want) == order.num_batches(offset)
                assert all(np.array_equal(a, b) for a, b in zip(got, want))
                cases += 1
    assert cases > 300
    under_repeats = EpochOrder(12, 12, repeats=3).batches(0)[0]
    assert np.array_equal(np.sort(under_repeats % 12), np.repeat(np.sort(under_repeats[::3]), 3))


def test_the_batch_sequence_indexes_slices_and_iterates_like_a_list():
    order = EpochOrder(100, 8, Shard(1, 3), seed=2)
    lazy, eager = order.batches(1, 9), reference_batches(order, 1, 9)
    assert len(lazy) == len(eager) == 4
    assert np.array_equal(lazy[-1], eager[-1]) and np.array_equal(lazy[2], eager[2])
    part = lazy[1:3]
    assert isinstance(part, Batches) and len(part) == 2 and np.array_equal(part[1], eager[2])
    assert [b.tolist() for b in lazy[::2]] == [b.tolist() for b in eager[::2]]
    with pytest.raises(IndexError):
        lazy[4]
    with pytest.raises(ValueError, match=r"positions must lie in \[0, 10\), got 3..10"):
        Permutation(10, 1)(np.array([3, 10]))
    with pytest.raises(ValueError, match="a permutation needs size >= 1, got 0"):
        Permutation(0, 1)
