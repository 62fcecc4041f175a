"""Shard-wise sampling: every sample once per epoch, equal ranks, few shards per rank, exact and
elastic resume from segment positions; shard by shard (mix_shards=1) and mixed in blocks (the
default, and blocks smaller than a rank's piece). Mixing itself: tests/test_shard_mixing.py."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from datapipe.sharding import Shard, ShardPlan

SIZES = (40, 37, 45, 41, 39, 44, 38, 42, 43, 36, 40, 35)  # 12 shards, 480 samples
MIXES = [{"mix_shards": 1}, {"mix_shards": 3}, {}]  # shard by shard, blocks of 3 shards, the default


def plans(world, batch=8, **kw):
    return [ShardPlan(SIZES, batch, Shard(r, world), seed=3, **kw) for r in range(world)]


def consume(world, position, batches, epoch=0, **kw):
    """Indices the ranks read in `batches` batches from `position`, and the position after."""
    ps = plans(world, **kw)
    read = [i for p in ps for b in p.batches(epoch, position)[:batches] for i in b.tolist()]
    return read, ps[0].offset_after(position, batches)


@pytest.mark.parametrize("mix", MIXES)
@pytest.mark.parametrize("world", [1, 2, 3, 5, 8])
def test_every_sample_once_equal_batches_and_only_a_few_shards_per_rank(world, mix):
    ps = plans(world, **mix)
    per_rank = [p.rank_indices(0) for p in ps]
    assert len({len(r) for r in per_rank}) == 1 and len({len(p) for p in ps}) == 1
    everything = np.concatenate(per_rank)
    assert set(everything.tolist()) == set(range(sum(SIZES)))
    assert len(everything) - sum(SIZES) < world  # padding only evens the ranks out
    for p, mine in zip(ps, per_rank):
        touched = set(p.shard_of(mine).tolist())
        assert len(touched) <= -(-len(SIZES) // world) + 2, (world, sorted(touched))
        assert sum(p.real_samples for p in ps) == sum(SIZES)


def test_each_epoch_a_new_shard_order_and_a_shuffle_inside_shards():
    p = plans(1, mix_shards=1)[0]
    e0, e1 = p.rank_indices(0), p.rank_indices(1)
    assert sorted(e0.tolist()) == sorted(e1.tolist()) and not np.array_equal(e0, e1)
    runs = [k for k, _ in itertools.groupby(p.shard_of(e0).tolist())]
    assert len(runs) == len(SIZES)  # shard by shard
    assert runs != sorted(runs)
    first = e0[: SIZES[runs[0]]]
    assert not np.array_equal(first, np.sort(first))
    assert np.array_equal(ShardPlan(SIZES, 8, shuffle=False).rank_indices(0), np.arange(sum(SIZES)))


@pytest.mark.parametrize("mix", MIXES)
@pytest.mark.parametrize("drop_last", [False, True])
def test_resume_at_the_same_world_size_is_the_exact_continuation(drop_last, mix):
    ps = plans(3, drop_last=drop_last, **mix)
    position = ps[0].offset_after(ps[0].start, 4)
    position = ps[0].offset_after(position, 2)  # two saves in a row at one world size stay one segment
    assert position == ((3, 48),)
    for p in ps:
        assert np.array_equal(p.rank_indices(1, position), p.rank_indices(1)[48:])
        assert p.num_batches(position) == len(p) - 6
        assert p.decode(p.encode(position)) == position


@pytest.mark.parametrize("mix", MIXES)
@pytest.mark.parametrize("worlds", [(3, 2), (2, 5), (4, 1, 3), (8, 3, 2)])
def test_elastic_resume_reads_every_remaining_sample_exactly_once(worlds, mix):
    position, seen = (), []
    for world in worlds[:-1]:
        read, position = consume(world, position, 3, **mix)
        seen += read
    last = plans(worlds[-1], **mix)
    rest = [i for p in last for i in p.rank_indices(0, position).tolist()]
    assert len({len(p.rank_indices(0, position)) for p in last}) == 1
    assert len(set(seen)) == len(seen)  # nothing read twice before the end of the epoch
    assert set(seen) | set(rest) == set(range(sum(SIZES)))
    assert len(seen) + len(rest) - sum(SIZES) < worlds[-1]  # only the last deal's padding repeats


def test_drop_last_gives_full_batches_and_trims_at_most_world_times_batch():
    ps = plans(5, drop_last=True)
    got = [p.rank_indices(0) for p in ps]
    assert all(len(g) % 8 == 0 and len(g) == len(got[0]) for g in got)
    assert len(set(np.concatenate(got).tolist())) == len(np.concatenate(got))
    assert sum(SIZES) - 5 * len(got[0]) < 5 * 8


def test_positions_of_one_plan_are_refused_by_the_other():
    from datapipe.sharding import EpochPlan

    with pytest.raises(ValueError, match="sampling='shards'"):
        EpochPlan(480, 8).restore({"epoch": 0, "shard_position": [[2, 16]], "samples_done": 32})
    with pytest.raises(ValueError, match="global sampling"):
        ShardPlan(SIZES, 8).restore({"epoch": 0, "samples_done": 32})
