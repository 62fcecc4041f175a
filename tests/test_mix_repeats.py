"""Repeated augmentation over a mix (aug_repeats r, timm's RepeatAugSampler): an epoch of len(mix)
samples draws ceil(len(mix) / r) times by the weights, each draw served r times in a row with keys of
its own (so its augmentations differ), the copies dealt to different ranks; each source's stream goes
on by its draws; a resume at any position and world size serves the uninterrupted run."""
from __future__ import annotations

import collections
import random

import pytest

from datapipe.mix.order import MixOrder, MixState
from datapipe.order.sharding import Shard
from tests.test_mix_order import SIZES, curriculum, decoded, make_mix

TOTAL = sum(SIZES.values())


def order(mix, repeats, world=1, rank=0, state=None) -> MixOrder:
    return MixOrder(mix.epoch_size, 4, Shard(rank, world), 3, repeats=repeats, state=state or MixState(mix))


def epoch_keys(mix, repeats, epoch) -> list[int]:
    return [int(k) for k in order(mix, repeats).rank_indices(epoch)]


@pytest.mark.parametrize("epoch_size, repeats", [(60, 3), (61, 3), (60, 4), (7, 16)])
def test_each_draw_is_served_repeats_times_in_a_row_with_keys_of_its_own(epoch_size, repeats):
    mix = make_mix(curriculum, epoch_size=epoch_size)
    o = order(mix, repeats)
    draws = -(-epoch_size // repeats)
    for epoch in range(3):
        keys = epoch_keys(mix, repeats, epoch)
        assert len(keys) == epoch_size and len(set(keys)) == epoch_size  # every copy its own key
        records = [k % TOTAL for k in keys]
        groups = [records[i:i + repeats] for i in range(0, epoch_size, repeats)]
        assert len(groups) == draws and all(len(set(g)) == 1 for g in groups)  # a draw's copies in a row
        per_source = collections.Counter(name for name, _ in decoded(mix, [g[0] for g in groups]))
        assert tuple(per_source[n] for n in mix.names) == o.state.counts(epoch) == mix.counts(epoch, draws)


def test_each_source_goes_on_by_its_draws_every_record_once_before_any_twice():
    mix = make_mix(curriculum)
    per_source = collections.defaultdict(list)
    for epoch in range(8):
        keys = epoch_keys(mix, 3, epoch)
        for name, record in decoded(mix, keys[::3]):
            per_source[name].append(record)
    for name, records in per_source.items():
        size = SIZES[name]
        for start in range(0, len(records) - size + 1, size):
            assert sorted(records[start:start + size]) == list(range(size)), name


def test_a_draws_copies_go_to_different_ranks():
    """Three ranks, three repeats: each rank reads one copy of every draw (as timm's sampler deals them)."""
    mix = make_mix(curriculum)
    ranks = [[int(k) for k in order(mix, 3, world=3, rank=r).rank_indices(0)] for r in range(3)]
    assert [k % TOTAL for k in ranks[0]] == [k % TOTAL for k in ranks[1]] == [k % TOTAL for k in ranks[2]]
    assert sorted(ranks[0] + ranks[1] + ranks[2]) == sorted(epoch_keys(mix, 3, 0))


@pytest.mark.parametrize("seed", range(4))
def test_resumed_at_random_positions_and_world_sizes_serves_the_uninterrupted_run(seed):
    """Three epochs, each served in segments at random world sizes (1-8) and random numbers of batches,
    the position saved and restored by a new order each time: the uninterrupted run's keys, the only
    extras the last world size's padding."""
    rng, mix, repeats, state = random.Random(seed), make_mix(curriculum), 3, None
    for epoch in range(3):
        got, offset, world = collections.Counter(), 0, 1
        while True:
            world = rng.randint(1, 8)
            o = order(make_mix(curriculum), repeats, world=world)
            offset = o.restore(state) if state is not None else 0
            left = o.num_batches(offset)
            take = left if rng.random() < 0.3 else rng.randint(0, left)
            for rank in range(world):
                rank_order = order(o.state.mix, repeats, world, rank, o.state)
                got.update(int(k) for b in rank_order.batches(epoch, offset)[:take] for k in b)
            offset = o.offset_after(offset, take)
            done = o.num_batches(offset) == 0
            state = {"epoch": epoch + done, **o.save(0 if done else offset, epoch + done)}
            if done:
                break
        expected = collections.Counter(epoch_keys(mix, repeats, epoch))
        assert not expected - got, f"epoch {epoch}: samples never served"
        assert sum((got - expected).values()) < world


def test_a_mid_epoch_state_under_other_repeats_is_refused_in_one_line():
    mix = make_mix(curriculum)
    state = {"epoch": 1, **order(mix, 3).save(12, 1)}
    assert state["mix"]["repeats"] == 3 and sum(state["mix"]["counts"]) == 20
    with pytest.raises(ValueError, match=r"^cannot resume mid-epoch: the state was saved with other aug_repeats "
                                         r"\(repeated augmentation\) \(3, this mix has 4\)"):
        order(make_mix(curriculum), 4).restore(state)
    assert order(make_mix(curriculum), 3, world=2).restore(state) == 12


def test_a_state_from_before_repeats_over_a_mix_resumes():
    mix = make_mix(curriculum)
    state = {"epoch": 1, **order(mix, 1).save(12, 1)}
    del state["mix"]["repeats"]
    assert order(make_mix(curriculum), 1).restore(state) == 12
