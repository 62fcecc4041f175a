"""A mix's epoch in closed form (datapipe.mix.draws): exact counts, every (source, draw) once, the
sources spread through the epoch, each source's stream a sequence of whole permutations."""
from __future__ import annotations

import math

import numpy as np
import pytest

from datapipe.mix.draws import SourceStream, apportion, locate


@pytest.mark.parametrize("weights, total, expected", [
    ((0.7, 0.3), 10, (7, 3)),
    ((1, 1, 1), 10, (4, 3, 3)),  # the remainder to the earlier source on a tie
    ((0.5, 0, 0.5), 7, (4, 0, 3)),
    ((2, 1), 1, (1, 0)),
    ((1e-9, 1), 5, (0, 5)),
    ((0.1, 0.2, 0.7), 1_281_167, (128117, 256233, 896817)),
])
def test_apportion_is_largest_remainder_and_sums_to_the_total(weights, total, expected):
    assert apportion(weights, total) == expected
    assert sum(apportion(weights, total)) == total


@pytest.mark.parametrize("counts", [(1,), (5, 0, 3), (701, 200, 100), (1, 1, 1, 1, 1, 1, 1), (64, 64), (0, 13)])
@pytest.mark.parametrize("key", [None, 12345])
def test_locate_gives_every_draw_of_every_source_once(counts, key):
    size = sum(counts)
    source, draw = locate(counts, np.arange(size), key)
    for s, c in enumerate(counts):
        assert sorted(draw[source == s]) == list(range(c))


def test_locate_is_a_pure_function_of_the_position():
    counts = (500, 300, 200)
    source, draw = locate(counts, np.arange(1000), 7)
    picks = np.array([999, 0, 512, 3, 3])
    s, d = locate(counts, picks, 7)
    assert (s == source[picks]).all() and (d == draw[picks]).all()
    other, _ = locate(counts, np.arange(1000), 8)
    assert (other != source).any()  # another key (epoch), another pattern


def test_every_window_holds_each_source_near_its_share():
    """Any window of 10% of the epoch: each source within 2 log2(window) + 2 of weight x window."""
    counts = apportion((0.6, 0.3, 0.1), 100_000)
    source, _ = locate(counts, np.arange(100_000), 3)
    window = 10_000
    cumulative = np.vstack([np.zeros(3, np.int64), np.cumsum(np.eye(3, dtype=np.int64)[source], axis=0)])
    starts = np.arange(0, 100_000 - window + 1, 997)
    held = cumulative[starts + window] - cumulative[starts]
    off = np.abs(held - np.array(counts) * window / 100_000)
    assert off.max() <= 2 * math.log2(window) + 2, off.max()


def test_every_aligned_block_of_the_halving_holds_each_source_within_two_of_its_share():
    for counts, key in (((31, 1, 1), None), ((1, 2, 31), 1), ((600, 300, 99, 1), 5), ((7, 0, 13), 2)):
        size = sum(counts)
        source, _ = locate(counts, np.arange(size), key)
        blocks = [(0, size)]
        while blocks:
            lo, length = blocks.pop()
            held = np.bincount(source[lo:lo + length], minlength=len(counts))
            assert (np.abs(held - np.array(counts) * length / size) < 2).all(), (counts, lo, length)
            if length > 1:
                blocks += [(lo, length // 2), (lo + length // 2, length - length // 2)]


def test_locate_at_two_billion_positions_is_exact_for_the_positions_asked():
    """Within any run of positions, each source's draw numbers go up by one at each of its positions."""
    counts = apportion((0.5, 0.25, 0.25), 2_000_000_000)
    for start in (0, 1_234_567_890, 2_000_000_000 - 3000):
        source, draw = locate(counts, np.arange(start, start + 3000), 11)
        for s in range(3):
            mine = draw[source == s]
            assert len(mine) and (np.diff(mine) == 1).all() and mine[-1] < counts[s]
    first, _ = locate(counts, np.array([0]), 11)
    last, d = locate(counts, np.array([1_999_999_999]), 11)
    assert d[0] == counts[last[0]] - 1  # the epoch's last position is its source's last draw
    with pytest.raises(ValueError, match="positions must lie in"):
        locate(counts, np.array([2_000_000_000]), 11)


def test_a_stream_serves_every_record_once_before_any_twice():
    stream = SourceStream(37, seed=5, name="web", shuffle=True)
    records, cycles = stream.records(np.arange(37 * 4))
    for k in range(4):
        assert sorted(records[cycles == k]) == list(range(37))
    assert not np.array_equal(records[:37], records[37:74])  # each cycle its own permutation
    again, _ = SourceStream(37, seed=5, name="web", shuffle=True).records(np.arange(37 * 4))
    assert (again == records).all()
    other, _ = SourceStream(37, seed=5, name="ours", shuffle=True).records(np.arange(37))
    assert not np.array_equal(other, records[:37])  # keyed by the source's name
    plain, _ = SourceStream(37, seed=5, name="web", shuffle=False).records(np.arange(40))
    assert list(plain) == list(range(37)) + [0, 1, 2]


def test_a_sharded_stream_reads_each_record_once_a_cycle_a_few_shards_at_a_time():
    from datapipe.mix.draws import ShardStream

    sizes = [10] * 40 + [7]
    stream = ShardStream(sizes, seed=1, name="web", shuffle=True, interleave_shards=4)
    records, cycles = stream.records(np.arange(407 * 3))
    for k in range(3):
        assert sorted(records[cycles == k]) == list(range(407))
    assert not np.array_equal(records[:407], records[407:814])
    shards = stream.shards(np.arange(407))
    widest = max(len(set(shards[i:i + 40])) for i in range(407 - 40))
    assert widest <= 8  # any 40 consecutive draws: within two blocks of 4 shards
    whole = SourceStream(407, seed=1, name="web", shuffle=True)
    first = np.r_[0, np.cumsum(sizes)]
    spread = np.searchsorted(first, whole.records(np.arange(407))[0], side="right") - 1
    assert max(len(set(spread[i:i + 40])) for i in range(407 - 40)) > widest  # a permutation of records: no locality
    plain, _ = ShardStream(sizes, seed=1, name="web", shuffle=False, interleave_shards=4).records(np.arange(20))
    assert list(plain) == list(range(20))
