"""Shard-wise sampling mixes shards: on a dataset written class by class, a batch's labels are about as
balanced as under a full random permutation, every sample still comes once per epoch, resume stays
exact (same world size) and elastic (another), and the cache bound covers what the readers hold."""
from __future__ import annotations

import numpy as np
import pytest

from datapipe.backends import shards_held
from datapipe.backends.options import LoaderOptions
from datapipe.order.sharding import READ_AHEAD_SHARDS, Shard, ShardOrder

SHARDS, PER_SHARD, CLASSES, BATCH = 64, 32, 8, 32
SORTED = (PER_SHARD,) * SHARDS  # a foreign dataset written class by class: shard k holds class k // 8 only
LABELS = np.repeat(np.arange(SHARDS) * CLASSES // SHARDS, PER_SHARD)
EPOCHS = 8


def mean_tv(per_rank: list[np.ndarray], batch: int = BATCH) -> float:
    """Mean total-variation distance between each full batch's label histogram and the dataset's."""
    whole = np.bincount(LABELS, minlength=CLASSES) / len(LABELS)
    tvs = [0.5 * np.abs(np.bincount(LABELS[mine[i:i + batch]], minlength=CLASSES) / batch - whole).sum()
           for mine in per_rank for i in range(0, len(mine) - batch + 1, batch)]
    return float(np.mean(tvs))


def random_baseline(world: int, epochs: int = EPOCHS) -> float:
    """The same measure for a full random permutation dealt to the ranks (what global sampling gives)."""
    return float(np.mean([mean_tv([np.random.default_rng([99, e]).permutation(len(LABELS))[r::world]
                                   for r in range(world)]) for e in range(epochs)]))


def orders(world, sizes=SORTED, batch=BATCH, **kw):
    return [ShardOrder(sizes, batch, Shard(r, world), seed=5, **kw) for r in range(world)]


def test_batches_of_a_class_sorted_dataset_are_mixed_almost_like_a_random_permutation():
    mixed = np.mean([mean_tv([p.rank_indices(e) for p in orders(2)]) for e in range(EPOCHS)])
    baseline = random_baseline(2)
    assert mixed <= 1.5 * baseline, (mixed, baseline)
    distinct = [len(set(p.shard_of(b).tolist())) for p in orders(2) for b in p.batches(0)]
    assert np.median(distinct) >= 8  # a batch draws from many open shards, not one or two


def test_every_sample_once_per_epoch_a_new_order_each_epoch_and_equal_ranks():
    for world in (1, 2, 3, 5):
        ps = orders(world)
        epochs = []
        for epoch in range(3):
            per_rank = [p.rank_indices(epoch) for p in ps]
            assert len({len(r) for r in per_rank}) == 1
            everything = np.concatenate(per_rank)
            assert set(everything.tolist()) == set(range(len(LABELS)))
            assert len(everything) - len(LABELS) < world  # padding only evens the ranks out
            epochs.append(everything)
        assert not np.array_equal(epochs[0], epochs[1]) and not np.array_equal(epochs[1], epochs[2])
    p = ShardOrder(SORTED, BATCH, shuffle=False)
    assert np.array_equal(p.rank_indices(0), np.arange(len(LABELS)))  # evaluation keeps the stored order


def test_each_rank_still_reads_only_its_share_of_the_shards_and_a_block_spans_at_most_interleave_shards():
    for p in orders(4, interleave_shards=4):
        mine = p.rank_indices(0)
        shards = p.shard_of(mine)
        assert len(set(shards.tolist())) <= SHARDS // 4 + 2
        # blocks of 4 shards' samples: any stretch inside one block reads at most those 4 shards
        assert all(len(set(shards[i:i + 4 * PER_SHARD].tolist())) <= 2 * 4 for i in range(0, len(mine), PER_SHARD))
        assert len(set(shards[:4 * PER_SHARD].tolist())) == 4  # the first block: four shards, all mixed


@pytest.mark.parametrize("interleave_shards", [3, None])
@pytest.mark.parametrize("drop_last", [False, True])
def test_resume_mid_block_at_the_same_world_size_is_the_exact_continuation(interleave_shards, drop_last):
    kw = {"drop_last": drop_last, **({"interleave_shards": interleave_shards} if interleave_shards else {})}
    ps = orders(3, batch=8, **kw)
    position = ps[0].offset_after(ps[0].start, 5)  # 40 samples: in the middle of a block
    for p in ps:
        assert np.array_equal(p.rank_indices(2, position), p.rank_indices(2)[40:])
        assert p.num_batches(position) == len(p) - 5
        assert p.decode(p.encode(position)) == position


@pytest.mark.parametrize("interleave_shards", [3, None])
@pytest.mark.parametrize("worlds", [(2, 3), (3, 2), (2, 3, 2), (3, 5, 1)])
@pytest.mark.parametrize("drop_last", [False, True])
def test_elastic_resume_with_mixing_serves_every_remaining_sample_exactly_once(interleave_shards, worlds, drop_last):
    kw = {"drop_last": drop_last, **({"interleave_shards": interleave_shards} if interleave_shards else {})}
    position, seen = (), []
    for n, world in enumerate(worlds[:-1]):
        ps = orders(world, batch=8, **kw)
        seen += [i for p in ps for b in p.batches(1, position)[:5 + n] for i in b.tolist()]
        position = ps[0].offset_after(position, 5 + n)
    last = orders(worlds[-1], batch=8, **kw)
    rest = [p.rank_indices(1, position) for p in last]
    assert len({len(r) for r in rest}) == 1
    rest = np.concatenate(rest).tolist()
    assert len(set(seen)) == len(seen)  # nothing read twice before the end of the epoch
    if drop_last:
        assert not set(seen) & set(rest) and len(set(rest)) == len(rest)
        assert len(LABELS) - len(seen) - len(rest) < worlds[-1] * (8 + 1)  # the last deal's trimmed tail
    else:
        assert set(seen) | set(rest) == set(range(len(LABELS)))
        assert len(seen) + len(rest) - len(LABELS) < worlds[-1]  # only the last deal's padding repeats


@pytest.mark.parametrize("worlds", [(2, 3), (3, 2)])
def test_the_rest_of_an_epoch_after_an_elastic_resume_is_mixed_too(worlds):
    position = orders(worlds[0])[0].offset_after((), 7)  # mid-block: the rest has many partly read shards
    rest = np.mean([mean_tv([p.rank_indices(e, position) for p in orders(worlds[1])]) for e in range(EPOCHS)])
    assert rest <= 2 * random_baseline(worlds[1]), rest  # shard by shard: 4x and more


@pytest.mark.parametrize("workers,batch", [(1, 8), (2, 32), (4, 32), (8, 64)])
def test_the_cache_bound_covers_the_shards_in_flight_and_read_ahead_and_hints_come_a_few_at_a_time(workers, batch):
    options = LoaderOptions(batch_size=batch, num_workers=workers, prefetch_factor=2, device="cpu")
    sizes = tuple(int(n) for n in np.random.default_rng(0).integers(24, 40, size=96))
    held = shards_held(options, list(sizes), ShardOrder.interleave_shards)
    for p in orders(2, sizes=sizes, batch=batch):
        for position in (p.start, p.offset_after(p.start, 3)):
            batches = p.batches(0, position)
            hints = p.shards_ahead(batches, READ_AHEAD_SHARDS)
            window = workers * 2
            for i in range(len(batches)):
                live = {s for h in hints[i:i + window] for s in h}
                assert len(live) <= held, (i, len(live), held)
            fetched = set(hints[0])  # the first batch asks for its whole block
            for h in hints[1:]:  # the next block's shards are asked for a few per batch, not all at once
                assert len(set(h) - fetched) <= p.interleave_shards // 2 + READ_AHEAD_SHARDS + batch // min(sizes) + 2
                fetched |= set(h)
    assert shards_held(LoaderOptions(batch_size=4, num_workers=1, train=False, device="cpu"), [7] * 9, 16) == 6
    # never more than the split has: one shard of 188 KB is all a rank can hold (a docs walk's finding)
    assert shards_held(LoaderOptions(batch_size=4, num_workers=1, train=False, device="cpu"), [7, 7, 7, 6], 16) == 4
    assert shards_held(LoaderOptions(batch_size=4, num_workers=1, device="cpu"), [27], 16) == 1


def test_a_bad_interleave_shards_is_refused_and_a_state_from_before_mixing_is_warned_about(caplog):
    with pytest.raises(ValueError, match=r"interleave_shards must be an int >= 1 \(1: shard by shard\), got 0"):
        ShardOrder(SORTED, BATCH, interleave_shards=0)
    p = ShardOrder(SORTED, BATCH)
    state = {"epoch": 3, **p.save(((1, 64),))}
    assert state["interleave_shards"] == p.interleave_shards and p.restore(state) == ((1, 64),) and not caplog.records
    del state["interleave_shards"]  # saved before shards were mixed: that epoch's rest cannot be exact
    assert p.restore(state) == ((1, 64),)
    assert "saved with interleave_shards=1" in caplog.text and "epoch 3" in caplog.text


def test_datapipe_shards_are_read_shard_by_shard_and_foreign_shards_are_mixed(packed_wds, foreign_shards):
    """Shards `datapipe convert` wrote were shuffled before they were cut: mixing them again would
    only make the cache hold more; other tools' shards are often written class by class."""
    from datapipe import make_loader

    options = dict(sampling="shards", batch_size=4, image_size=16, device="cpu", num_workers=0)
    assert make_loader(packed_wds, **options).order.interleave_shards == 1
    assert make_loader(foreign_shards, **options).order.interleave_shards == ShardOrder.interleave_shards > 1


def test_interleave_shards_is_a_loader_option_for_big_batches(packed_wds, foreign_shards):
    """Bigger batches need bigger blocks for the same balance (tools/shard_mixing.py: batch 256 is
    3.9x a random permutation at 16 shards a block, 1.1x at 128), at the cost of cache space."""
    from datapipe import make_loader

    options = dict(sampling="shards", batch_size=4, image_size=16, device="cpu", num_workers=0)
    assert make_loader(foreign_shards, interleave_shards=4, **options).order.interleave_shards == 4
    assert make_loader(packed_wds, interleave_shards=2, **options).order.interleave_shards == 2
    with pytest.raises(ValueError, match="interleave_shards must be an int >= 1"):
        make_loader(foreign_shards, interleave_shards=0, **options)
