"""A mix's weights function is asked once an epoch per process, and the answers a run used are the ones
it keeps serving: a resume replays the state's, a process that already answered otherwise is refused,
and DALI's workers get the main process's answers with the position. A function that is not pure
(`random`, the clock, a file being edited) then serves no record twice and skips none within a process."""
from __future__ import annotations

import collections
import random

import pytest

from datapipe.mix.sources import Mix
from datapipe.mix.order import MixOrder, MixState
from datapipe.order.sharding import Shard
from tests.test_mix_order import SIZES, Sized, decoded


class Counting:
    """A weights function that counts its calls per epoch."""

    def __init__(self) -> None:
        self.calls: collections.Counter = collections.Counter()

    def __call__(self, epoch: int) -> dict[str, float]:
        self.calls[epoch] += 1
        return {"big": 1 + epoch % 3, "web": 1, "small": 2}


def impure(epoch: int) -> dict[str, float]:
    """Another answer at every call (the defect's `random`-based function)."""
    return {"big": random.random(), "web": random.random(), "small": random.random()}


def make_mix(weights, epoch_size=60) -> Mix:
    return Mix({n: Sized(n, s) for n, s in SIZES.items()}, weights=weights, epoch_size=epoch_size)


def order(mix, world=1, rank=0, state=None) -> MixOrder:
    return MixOrder(mix.epoch_size, 4, Shard(rank, world), 3, state=state or MixState(mix))


def every_rank(mix, epoch, world=1, offset=0, state=None) -> list[int]:
    return [int(k) for rank in range(world) for k in order(mix, world, rank, state).rank_indices(epoch, offset)]


def streams_hold(mix, served_by_epoch) -> None:
    """Each source's records over the epochs, in order: every record once before any comes twice."""
    per_source = collections.defaultdict(list)
    for keys in served_by_epoch:
        for name, record in decoded(mix, keys):
            per_source[name].append(record)
    for name, records in per_source.items():
        size = SIZES[name]
        for start in range(0, len(records), size):
            cycle = records[start:start + size]
            assert len(set(cycle)) == len(cycle), f"{name}: a record twice within one pass of the source"


def test_a_weights_function_is_asked_once_an_epoch_over_a_run():
    """Each epoch's order, position saves and the draws before it: one call an epoch (was: every
    epoch's batches asked again for every epoch before it, 20 epochs -> 210 calls and more)."""
    weights = Counting()
    mix = make_mix(weights)
    o = order(mix)
    for epoch in range(20):
        o.rank_indices(epoch)
        o.save(8, epoch)
        mix.draws_before(epoch + 1)
    assert set(weights.calls) == set(range(20))
    assert max(weights.calls.values()) == 1


def test_draws_before_a_late_epoch_cost_one_step_an_epoch_from_the_last():
    mix = make_mix(Counting())
    for epoch in range(200):
        mix.draws_before(epoch)
    late = mix.draws_before(200)
    assert late == tuple(sum(mix.counts(e)[s] for e in range(200)) for s in range(3))


def test_an_impure_function_serves_no_record_twice_and_skips_none_within_a_process():
    """Five epochs, each read by one rank and by two in one process: the same epoch, its exact counts,
    and each source's stream goes on whole (was: each rank and each epoch asked anew)."""
    random.seed(0)
    mix = make_mix(impure)
    served = []
    for epoch in range(5):
        keys = every_rank(mix, epoch, world=2)
        assert len(keys) == len(set(keys)) == mix.epoch_size
        assert sorted(keys) == sorted(every_rank(mix, epoch))  # the same epoch, in one process or two ranks
        got = collections.Counter(name for name, _ in decoded(mix, keys))
        assert tuple(got[n] for n in mix.names) == mix.counts(epoch)
        served.append(every_rank(mix, epoch))  # in the epoch's order
    streams_hold(mix, served)


def test_a_resume_replays_the_counts_its_state_holds_without_asking():
    """Mid-epoch, in a new process (another Mix over the same sources, whose function now answers
    otherwise): the rest of the epoch is the state's, none served twice, none skipped."""
    random.seed(1)
    first = make_mix(impure)
    whole = collections.Counter(every_rank(first, 4))  # epoch 4: its draws before count on epochs 0-3's answers
    o = order(first, world=2)
    done = [int(k) for rank in range(2) for b in order(first, 2, rank).batches(4)[:3] for k in b]
    state = {"epoch": 4, **o.save(o.offset_after(0, 3), 4)}

    later = make_mix(impure)  # the same function, other answers: only the state's may be served
    resumed = order(later, world=3)
    rest = every_rank(later, 4, world=3, offset=resumed.restore(state), state=resumed.state)
    got = collections.Counter(done + rest)
    assert not whole - got
    assert sum((got - whole).values()) < 3  # the three ranks' padding only


def test_an_answer_that_differs_from_the_states_is_refused_as_impure():
    random.seed(2)
    mix = make_mix(impure)
    state = {"epoch": 1, **order(mix).save(8, 1)}
    other = make_mix(impure)
    other.counts(1)  # this process answered epoch 1 already, otherwise
    with pytest.raises(ValueError, match=r"^the Mix's weights function is not pure: it answered epoch 1 with the "
                                         r"counts \[.*\] in this process, and the state resumed holds") as err:
        order(other).restore(state)
    assert "\n" not in str(err.value)


def test_dali_workers_serve_the_main_processs_answers_never_asking():
    """The position DALI's workers read carries the epoch's counts and draws: a worker's copy of the
    order (made when the pipeline was built) serves the main process's batches with a function that
    would answer otherwise."""
    random.seed(3)
    main = order(make_mix(impure))
    position = main.encode(8, 2)
    worker = order(make_mix(impure))
    worker.state.mix._weights = lambda epoch: pytest.fail(f"a worker asked the weights of epoch {epoch}")
    offset = worker.adopt(position)
    assert worker.decode(position) == 8  # decode alone is pure: adopt takes the draws
    assert offset == 8
    assert list(worker.rank_indices(2, offset)) == list(main.rank_indices(2, 8))
