"""A mix's order, golden sequences: world sizes 1-8, resumed at random positions over several epochs
and a weight change; what every rank served is the uninterrupted run's samples, none twice, the
per-epoch counts exact, and every record of a source comes once before any comes twice."""
from __future__ import annotations

import collections
import random

import numpy as np
import pytest

from datapipe.formats.base import Dataset
from datapipe.mix.sources import Mix
from datapipe.mix.order import MixOrder, MixState
from datapipe.order.sharding import EpochOrder, Shard

SIZES = {"big": 53, "web": 31, "small": 7}
A = {"big": 0.5, "web": 0.3, "small": 0.2}
B = {"big": 0.1, "web": 0.1, "small": 0.8}  # the small source oversampled: several cycles an epoch


class Sized(Dataset):
    """A dataset of `size` records whose bytes the order never reads (it only counts them)."""

    def __init__(self, name: str, size: int) -> None:
        super().__init__(f"/data/{name}", split="train", classes=[], size=size)
        self.fingerprint = f"{name}-{size}"

    def _read(self, index):
        raise AssertionError("an order reads no records")


CLASSES = {"big": ["cat", "dog"], "web": ["dog", "emu"], "small": ["fox"]}


class Classed(Sized):
    def __init__(self, name: str, size: int, classes: list[str]) -> None:
        super().__init__(name, size)
        self.classes = classes


def make_mix(weights, epoch_size=60, sizes=SIZES) -> Mix:
    return Mix({n: Sized(n, s) for n, s in sizes.items()}, weights=weights, epoch_size=epoch_size)


def order(mix, world=1, rank=0, batch=4, seed=3, shuffle=True, state=None) -> MixOrder:
    return MixOrder(mix.epoch_size, batch, Shard(rank, world), seed, shuffle=shuffle,
                    state=state or MixState(mix))


def epoch_keys(mix, epoch, **kw) -> list[int]:
    return list(order(mix, **kw).rank_indices(epoch))


def decoded(mix, keys):
    """(source, record) of each key."""
    starts = np.concatenate([[0], np.cumsum(mix.sizes)])
    total = starts[-1]
    out = []
    for k in keys:
        i = k % total
        s = int(np.searchsorted(starts, i, side="right") - 1)
        out.append((mix.names[s], int(i - starts[s])))
    return out


def curriculum(epoch):
    return A if epoch < 2 else B


def test_each_epoch_has_the_exact_counts_and_a_new_order():
    mix = make_mix(curriculum)
    for epoch in range(4):
        served = collections.Counter(name for name, _ in decoded(mix, epoch_keys(mix, epoch)))
        assert tuple(served[n] for n in mix.names) == mix.counts(epoch)
    assert mix.counts(0) == (30, 18, 12) and mix.counts(3) == (6, 6, 48)
    assert epoch_keys(mix, 0) != epoch_keys(mix, 1)


def test_every_record_of_a_source_comes_once_before_any_comes_twice_across_epochs():
    mix = make_mix(curriculum)
    per_source = collections.defaultdict(list)
    for epoch in range(6):
        for name, record in decoded(mix, epoch_keys(mix, epoch)):
            per_source[name].append(record)
    for name, records in per_source.items():
        size = SIZES[name]
        for start in range(0, len(records) - size + 1, size):
            assert sorted(records[start:start + size]) == list(range(size)), name
        assert len(set(records[len(records) // size * size:])) == len(records) % size  # the open cycle: no repeat


def test_a_copy_in_one_epoch_has_its_own_key():
    mix = make_mix(B)  # small: 48 draws of 7 records in an epoch
    keys = epoch_keys(mix, 0)
    assert len(set(keys)) == len(keys)
    assert len(set(decoded(mix, keys))) < len(keys)


def run_interrupted(mix_for_epoch, epochs, rng, batch=4):
    """Each epoch served in segments at random world sizes, each segment a random number of batches on
    every rank, the position saved and restored between them (a new order each time, as a restarted
    job builds); returns per epoch the keys served by all ranks and the last segment's world size."""
    served, state = [], None
    for epoch in range(epochs):
        mix = mix_for_epoch(epoch)
        keys, offset = [], 0
        while True:
            world = rng.randint(1, 8)
            o = order(mix, world=world, batch=batch, state=MixState(mix))
            if state is not None:
                offset = o.restore(state)
            left = o.num_batches(offset)
            take = left if rng.random() < 0.3 else rng.randint(0, left)
            for rank in range(world):
                keys += [int(k) for b in order(mix, world=world, rank=rank, batch=batch, state=o.state)
                         .batches(epoch, offset)[:take] for k in b]
            offset = o.offset_after(offset, take)
            done = o.num_batches(offset) == 0
            state = {"epoch": epoch + 1 if done else epoch, **o.save(0 if done else offset, epoch + 1 if done else epoch)}
            if done:
                served.append((keys, world))
                break
    return served


@pytest.mark.parametrize("seed", range(6))
def test_resumed_at_random_positions_and_world_sizes_serves_the_uninterrupted_run(seed):
    reference = make_mix(curriculum)
    served = run_interrupted(lambda epoch: reference, 4, random.Random(seed))
    for epoch, (keys, last_world) in enumerate(served):
        expected = collections.Counter(epoch_keys(reference, epoch))
        got = collections.Counter(keys)
        assert not expected - got, f"epoch {epoch}: samples never served"
        extra = got - expected  # the last world size's padding: repeats of the epoch's first samples
        assert sum(extra.values()) < last_world
        assert set(extra) <= set(epoch_keys(reference, epoch)[:last_world])


@pytest.mark.parametrize("seed", range(3))
def test_weights_changed_at_an_epoch_boundary_continue_each_stream_exactly(seed):
    """A run on weights A for two epochs, resumed with weights B from epoch 2 (another Mix object): the
    same samples as one run on the curriculum A, A, B, B."""
    reference = make_mix(curriculum)
    served = run_interrupted(lambda epoch: make_mix(A if epoch < 2 else B), 4, random.Random(seed))
    for epoch, (keys, last_world) in enumerate(served):
        expected, got = collections.Counter(epoch_keys(reference, epoch)), collections.Counter(keys)
        assert not expected - got, epoch
        assert sum((got - expected).values()) < last_world  # padding only


def test_a_state_at_the_end_of_a_curriculum_asks_no_weights_of_the_epoch_after():
    schedule = [A, B]
    mix = make_mix(lambda epoch: schedule[epoch])  # defined for epochs 0 and 1 only
    o = order(mix)
    state = o.save(0, 2)  # after epoch 1's last batch: the start of epoch 2
    assert state["mix"]["draws_before"] == dict(zip(mix.names, mix.draws_before(2)))


def test_sources_given_in_another_order_are_refused_even_at_a_boundary():
    """Their classes would change index: a model's label 0 would mean another class."""
    def classed(names):
        return Mix({n: Classed(n, SIZES[n], CLASSES[n]) for n in names}, epoch_size=60)
    saved = {"epoch": 1, **order(classed(["big", "web"])).save(0, 1)}
    with pytest.raises(ValueError, match="classes changed order .*class 'cat' was label 0"):
        order(classed(["web", "big"])).restore(saved)
    assert order(classed(["big", "web", "small"])).restore(saved) == 0  # new classes after the old: fine


def test_keys_that_would_overflow_64_bits_are_refused():
    with pytest.raises(ValueError, match="overflow 64 bits"):
        make_mix(None, epoch_size=6 * 10**9, sizes={"huge": 4 * 10**9, "one": 1})


def test_a_resume_position_is_refused_under_another_mix_mid_epoch_but_not_at_a_boundary():
    mix = make_mix(A)
    o = order(mix, world=2)
    mid = {"epoch": 1, **o.save(o.offset_after(0, 2), 1)}
    with pytest.raises(ValueError, match=r"other per-source counts \(weights\) .*resume at an epoch boundary"):
        order(make_mix(B), world=3).restore(mid)
    scaled = {name: 100 * w for name, w in A.items()}  # the same counts: the same samples
    assert order(make_mix(scaled), world=3).restore(mid) == o.offset_after(0, 2)
    with pytest.raises(ValueError, match="other epoch_size"):
        order(make_mix(A, epoch_size=61)).restore(mid)
    with pytest.raises(ValueError, match="other sources"):
        order(make_mix({"big": 1, "web": 1}, sizes={"big": 53, "web": 31})).restore(mid)
    with pytest.raises(ValueError, match="other source records"):
        order(make_mix(A, sizes={**SIZES, "web": 32})).restore(mid)
    boundary = {"epoch": 2, **o.save(0, 2)}
    assert order(make_mix(B)).restore(boundary) == 0


def test_a_single_dataset_state_and_a_mix_state_do_not_cross():
    mix = make_mix(A)
    single = {"epoch": 0, **EpochOrder(60, 4).save(8)}
    with pytest.raises(ValueError, match="over one dataset, this loader reads a Mix"):
        order(mix).restore(single)
    with pytest.raises(ValueError, match="over a Mix of .*this loader reads one dataset"):
        EpochOrder(60, 4).restore({"epoch": 0, **order(mix).save(8, 0)})


def test_the_position_sent_to_dali_workers_carries_the_resumed_draws():
    mix = make_mix(A)
    o = order(mix)
    o.restore({"epoch": 2, **order(make_mix(B)).save(0, 2)})  # draws carried from a run on B
    worker = order(mix)  # the copy a worker made before the restore
    assert worker.adopt(o.encode(4)) == 4
    assert list(worker.rank_indices(2)) == list(o.rank_indices(2))
    assert list(o.rank_indices(2)) != epoch_keys(mix, 2)


def test_an_unshuffled_mix_reads_each_source_in_order_with_the_same_pattern_every_epoch():
    mix = make_mix(None, epoch_size=sum(SIZES.values()))
    got = decoded(mix, epoch_keys(mix, 0, shuffle=False))
    for name, size in SIZES.items():
        assert [r for n, r in got if n == name] == list(range(size))
    again = decoded(mix, epoch_keys(mix, 1, shuffle=False))
    assert [n for n, _ in again] == [n for n, _ in got]
    shuffled = [decoded(mix, epoch_keys(mix, e)) for e in (0, 1)]
    assert [n for n, _ in shuffled[0]] != [n for n, _ in shuffled[1]]
