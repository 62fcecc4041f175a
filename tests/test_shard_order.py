"""Shard-wise sampling: every sample once per epoch, equal ranks, few shards per rank, exact and
elastic resume from segment positions; shard by shard (interleave_shards=1) and mixed in blocks (the
default, and blocks smaller than a rank's piece). Mixing itself: tests/test_shard_mixing.py."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from datapipe.order.sharding import Shard, ShardOrder

pytestmark = pytest.mark.forked  # tracemalloc in a child with one thread (tests/forked.py)

SIZES = (40, 37, 45, 41, 39, 44, 38, 42, 43, 36, 40, 35)  # 12 shards, 480 samples
MIXES = [{"interleave_shards": 1}, {"interleave_shards": 3}, {}]  # shard by shard, blocks of 3 shards, the default


def orders(world, batch=8, **kw):
    return [ShardOrder(SIZES, batch, Shard(r, world), seed=3, **kw) for r in range(world)]


def consume(world, position, batches, epoch=0, **kw):
    """Indices the ranks read in `batches` batches from `position`, and the position after."""
    ps = orders(world, **kw)
    read = [i for p in ps for b in p.batches(epoch, position)[:batches] for i in b.tolist()]
    return read, ps[0].offset_after(position, batches)


@pytest.mark.parametrize("mix", MIXES)
@pytest.mark.parametrize("world", [1, 2, 3, 5, 8])
def test_every_sample_once_equal_batches_and_only_a_few_shards_per_rank(world, mix):
    ps = orders(world, **mix)
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
    p = orders(1, interleave_shards=1)[0]
    e0, e1 = p.rank_indices(0), p.rank_indices(1)
    assert sorted(e0.tolist()) == sorted(e1.tolist()) and not np.array_equal(e0, e1)
    runs = [k for k, _ in itertools.groupby(p.shard_of(e0).tolist())]
    assert len(runs) == len(SIZES)  # shard by shard
    assert runs != sorted(runs)
    first = e0[: SIZES[runs[0]]]
    assert not np.array_equal(first, np.sort(first))
    assert np.array_equal(ShardOrder(SIZES, 8, shuffle=False).rank_indices(0), np.arange(sum(SIZES)))


@pytest.mark.parametrize("mix", MIXES)
@pytest.mark.parametrize("drop_last", [False, True])
def test_resume_at_the_same_world_size_is_the_exact_continuation(drop_last, mix):
    ps = orders(3, drop_last=drop_last, **mix)
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
    last = orders(worlds[-1], **mix)
    rest = [i for p in last for i in p.rank_indices(0, position).tolist()]
    assert len({len(p.rank_indices(0, position)) for p in last}) == 1
    assert len(set(seen)) == len(seen)  # nothing read twice before the end of the epoch
    assert set(seen) | set(rest) == set(range(sum(SIZES)))
    assert len(seen) + len(rest) - sum(SIZES) < worlds[-1]  # only the last deal's padding repeats


def test_drop_last_gives_full_batches_and_trims_at_most_world_times_batch():
    ps = orders(5, drop_last=True)
    got = [p.rank_indices(0) for p in ps]
    assert all(len(g) % 8 == 0 and len(g) == len(got[0]) for g in got)
    assert len(set(np.concatenate(got).tolist())) == len(np.concatenate(got))
    assert sum(SIZES) - 5 * len(got[0]) < 5 * 8


def test_positions_of_one_order_are_refused_by_the_other():
    from datapipe.order.sharding import EpochOrder

    with pytest.raises(ValueError, match="sampling='shards'"):
        EpochOrder(480, 8).restore({"epoch": 0, "shard_position": [[2, 16]], "samples_done": 32})
    with pytest.raises(ValueError, match="global sampling"):
        ShardOrder(SIZES, 8).restore({"epoch": 0, "samples_done": 32})


def test_a_rank_computes_a_batch_of_a_billion_record_epoch_without_holding_the_epoch():
    """The epoch order is computed, not stored (#33): the middle batch of a 10^9-record epoch, resumed
    mid-epoch, costs one batch's arithmetic, on one rank of eight and on a rank alone."""
    import tracemalloc

    from datapipe.order.sharding import EpochOrder

    size, batch, offset = 10**9, 256, 123_456_789
    for shard in (Shard(5, 8), Shard(0, 1)):
        order = EpochOrder(size, batch, shard, seed=1)
        tracemalloc.start()
        try:
            batches = order.batches(3, offset)
            middle = batches[len(batches) // 2]
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 1 << 20, peak  # under 1 MiB: the epoch's order would be 8 GB
        assert len(batches) == order.num_batches(offset) and len(middle) == batch
        assert len(np.unique(middle)) == batch and 0 <= middle.min() and middle.max() < size
        later = order.batches(3, order.offset_after(offset, 1))  # resumed one batch later: the same batches on
        assert np.array_equal(later[len(batches) // 2 - 1], middle)


def test_a_mid_epoch_state_saved_in_another_order_is_refused_and_one_at_an_epoch_boundary_resumes():
    """Both orders: a position saved without the order's version (before #33) counts in another order."""
    from datapipe.order.sharding import EpochOrder

    order = EpochOrder(480, 8, Shard(0, 2), seed=3)
    assert order.restore({"epoch": 2, **order.save(32)}) == 32
    with pytest.raises(ValueError, match=r"^cannot resume mid-epoch: the state was saved with the epoch order "
                                         r"'numpy-permutation', .* at an epoch boundary, or with the datapipe version"):
        order.restore({"epoch": 2, "samples_done": 32})  # saved by a datapipe from before the computed order
    assert order.restore({"epoch": 2, "samples_done": 0}) == 0
    assert EpochOrder(480, 8, shuffle=False).restore({"epoch": 2, "samples_done": 32}) == 32  # the stored order
    shardwise = ShardOrder(SIZES, 8, Shard(0, 2), seed=3)
    assert shardwise.restore({"epoch": 2, **shardwise.save(((2, 16),))}) == ((2, 16),)
    with pytest.raises(ValueError, match=r"^cannot resume mid-epoch: the state was saved with the epoch order"):
        shardwise.restore({"epoch": 2, "shard_position": [[2, 16]], "interleave_shards": 16, "samples_done": 32})
    assert shardwise.restore({"epoch": 2, "shard_position": [], "interleave_shards": 16, "samples_done": 0}) == ()


def stored_batches(p: ShardOrder, epoch: int, position=()) -> list[np.ndarray]:
    """The order's batches as they were computed with the whole order stored (before #33): the same
    keyed order and mixing draws, materialised, the rest rebuilt through `place` and mixed with a
    lexsort over whole pieces."""
    from datapipe.order.permutation import uniform
    from datapipe.order.shardwise import ShardwisePermutation

    order = ShardwisePermutation(p.shard_sizes, seed=p.seed, epoch=epoch, shuffle=p.shuffle).records(np.arange(p.size))
    place = np.empty_like(order)
    place[order] = np.arange(len(order))

    def mixed(piece, segment, world, rank):
        key = p._mixing(epoch, segment, world, rank)
        if key is None or len(piece) < 2:
            return piece
        shards = p.shard_of(piece)
        new_run = np.r_[True, shards[1:] != shards[:-1]]
        run, starts = np.cumsum(new_run) - 1, np.flatnonzero(new_run)
        sizes = np.diff(np.r_[starts, len(piece)])
        at = (np.arange(len(piece)) - starts[run] + uniform(np.arange(len(piece)), key)) / sizes[run]
        return piece[np.lexsort((at, run * (-(-len(starts) // p.interleave_shards)) // len(starts)))]

    segments, consumed = p._split(tuple(position))
    rest = order
    for k, (world, used) in enumerate(segments):
        piece = p._piece(len(rest), world)
        tails = [mixed(rest[r * piece:(r + 1) * piece], k, world, r)[used:] for r in range(world)]
        rest = np.concatenate(tails + ([rest[world * piece:]] if p.drop_last else []))
        rest = order[np.sort(place[rest])]
    world, rank = p.shard.world_size, p.shard.rank
    piece = p._piece(len(rest), world)
    padded = np.concatenate([rest, np.resize(order, world * piece - len(rest))]) if world * piece > len(rest) else rest
    real = max(0, min(piece, len(rest) - rank * piece))
    ours = padded[rank * piece:(rank + 1) * piece]
    mine = np.concatenate([mixed(ours[:real], len(segments), world, rank), ours[real:]])[consumed:]
    mine = mine[: p.num_batches(position) * p.batch_size] if p.drop_last else mine
    return [mine[i:i + p.batch_size] for i in range(0, len(mine), p.batch_size)]


def stored_hints(p: ShardOrder, batches: list[np.ndarray], count: int) -> list[tuple[int, ...]]:
    """shards_ahead as it was computed over the whole list of batches (before #33)."""
    shards = p.shard_of(np.concatenate(batches))
    found, first = np.unique(shards, return_index=True)
    by_first = np.argsort(first)
    upcoming, first = found[by_first], first[by_first]
    unmixed = np.r_[0, np.cumsum(np.bincount(shards)[upcoming])[:-1]]
    lead = ((p.interleave_shards if p.shuffle else 1) - 1) * p.size // len(p.shard_sizes)
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


@pytest.mark.parametrize("mix", MIXES + [{"shuffle": False}])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("sizes,worlds", [(SIZES[:5] + (0, 3) + SIZES[5:], w) for w in [
    (1,), (3,), (8,), (3, 3), (3, 2), (2, 5), (4, 1, 3), (5, 8)]] + [
    ((21,), (3, 4)), ((13, 9), (5, 3)), ((20, 1), (2, 3))])
def test_the_computed_stream_is_the_stored_orders_batches_and_hints_at_every_position(sizes, worlds, drop_last, mix):
    """Each rank's batches and read-ahead hints, computed block by block from the order (#33), are
    those of the order materialised and sliced as before, fresh, mid-block and after elastic segments,
    with an empty shard and shards smaller than a batch among them, and padding that reads a shard
    the rank reads anyway (one or two shards)."""
    position = ()
    for world in worlds:
        ps = [ShardOrder(sizes, 4, Shard(r, world), seed=3, drop_last=drop_last, **mix) for r in range(world)]
        for p in ps:
            want = stored_batches(p, 1, position)
            got = p.batches(1, position)
            assert len(got) == len(want) and all(np.array_equal(a, b) for a, b in zip(got, want))
            assert list(p.shards_ahead(got, 2)) == stored_hints(p, want, 2) if want else True
        position = ps[0].offset_after(position, 2 + len(position))


def test_a_rank_reads_a_batch_of_a_billion_record_shardwise_epoch_without_holding_the_epoch():
    """Shard-wise sampling computes its order too: 10^9 records in 10^5 shards, one rank of eight,
    the middle batch and its read-ahead hint after an elastic resume hold the shards' tables and a few
    blocks (the order stored: 8 GB and more)."""
    import tracemalloc

    sizes = (10_000,) * 100_000
    tracemalloc.start()
    try:
        position = ShardOrder(sizes, 256, Shard(0, 4), seed=1).offset_after((), 1000)
        order = ShardOrder(sizes, 256, Shard(5, 8), seed=1)
        batches = order.batches(2, position)
        middle, hint = batches[len(batches) // 2], order.shards_ahead(batches, 2)[len(batches) // 2]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20, peak  # the tables (10^5 shards) and blocks of 16 x 10^4 records, per rank of 4 then 8
    assert len(np.unique(middle)) == 256 and set(order.shard_of(middle).tolist()) <= set(hint)
