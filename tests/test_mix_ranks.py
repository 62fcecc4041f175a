"""Two gloo ranks (spawned, each run with a deadline): a weights function that answers an epoch alike
on both passes; one that reads `random` gives each rank other answers (each would serve samples of
another epoch: records twice, others never) and is refused in one line on every rank."""
from __future__ import annotations

import random

from datapipe.mix.sources import Mix
from datapipe.mix.order import MixOrder, MixState
from datapipe.order.sharding import Shard
from tests.test_mix_order import SIZES, Sized
from tests.train.ranks import spawn_ranks


def pure(epoch: int) -> dict[str, float]:
    return {"big": 1 + epoch, "web": 2, "small": 1}


def impure(epoch: int) -> dict[str, float]:
    return {"big": random.random(), "web": random.random(), "small": 1}


def first_batches(rank: int, world: int) -> list[int]:
    """Epoch 0's first batch of this rank under the pure function (the ranks agree), then under the
    impure one (each spawned rank's `random` is seeded apart: they cannot agree)."""
    out = []
    for weights in (pure, impure):
        mix = Mix({n: Sized(n, s) for n, s in SIZES.items()}, weights=weights, epoch_size=10**6)
        order = MixOrder(mix.epoch_size, 4, Shard(rank, world), 3, state=MixState(mix))
        out.append([int(k) for k in order.batches(0)[0]])
    return out


def test_ranks_whose_weights_function_answers_otherwise_are_refused():
    outcomes = spawn_ranks(first_batches, 2, timeout=120)
    assert [o.get("error") for o in outcomes] == ["ValueError", "ValueError"], outcomes
    for o in outcomes:
        assert o["message"].startswith("the Mix's weights function is not pure: ranks 0 and 1 have other answers "
                                       "for epoch 0"), o
        assert "\n" not in o["message"]
