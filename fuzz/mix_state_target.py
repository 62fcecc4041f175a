"""The `mix_state` fuzz target: a loader state over a datapipe.Mix (its `mix` block: names, fingerprints,
epoch size, classes, counts, streams, draws before the epoch), as a hand-edited checkpoint or a
stranger's file would give it, loaded by a mix's order (datapipe/mix/order.py, datapipe/mix/state.py).
fuzz/targets.py registers it.

An input is one mode byte, then the state as JSON (a state_dict is plain values). Mode bit 0 picks the
mix's weights: fixed, or a (pure) function of the epoch, whose mid-epoch counts a resume replays; bit 1
the world size that loads it (1 or 3); bit 2 repeated augmentation (aug_repeats 1 or 3). The oracle: a one-line ValueError at load, or a load of a whole
state (every key the loader writes for that position present, an epoch >= 0, a position within the
epoch) that then serves exactly like a valid state: the position it took, saved again by the loader and
loaded by a fresh one, serves the same keys, each a record of the mix with the epoch's counts bounding
each source; in time and within the memory bound.
"""
from __future__ import annotations

import json
import time

import numpy as np

from fuzz.contract import Finding, Target, timed

SIZES = {"big": 53, "web": 31, "small": 7}
CLASSES = {"big": ["cat", "dog"], "web": ["dog", "emu"], "small": ["fox"]}
EPOCH_SIZE = 60


def _curriculum(epoch: int) -> dict[str, float]:
    return {"big": 0.5, "web": 0.3, "small": 0.2} if epoch % 3 else {"big": 0.1, "web": 0.1, "small": 0.8}


def _mix(curriculum: bool):
    from datapipe.formats.base import Dataset
    from datapipe.mix.sources import Mix

    class Sized(Dataset):
        """`size` records the order counts and never reads."""

        def __init__(self, name: str) -> None:
            super().__init__(f"/data/{name}", split="train", classes=CLASSES[name], size=SIZES[name])
            self.fingerprint = f"{name}-{SIZES[name]}"

        def _read(self, index):
            raise Finding("mix_state: an order read a record")

    weights = _curriculum if curriculum else {"big": 0.7, "web": 0.2, "small": 0.1}
    return Mix({name: Sized(name) for name in SIZES}, weights=weights, epoch_size=EPOCH_SIZE)


def _order(mix, world: int, rank: int = 0, repeats: int = 1):
    from datapipe.mix.order import MixOrder, MixState
    from datapipe.order.sharding import Shard

    return MixOrder(mix.epoch_size, 8, Shard(rank, world), 3, repeats=repeats, state=MixState(mix))


def mix_state_seeds() -> list[bytes]:
    """States of both mixes, at an epoch's start and mid-epoch, at epochs 0, 1 and 4."""
    seeds = []
    for mode in range(8):
        order = _order(_mix(bool(mode & 1)), 3 if mode & 2 else 1, repeats=3 if mode & 4 else 1)
        for epoch, offset in ((0, 0), (1, 12), (4, 36), (4, 0)):
            state = {"epoch": epoch, **order.save(offset, epoch)}
            seeds.append(bytes([mode]) + json.dumps(state).encode())
    return seeds


def _load(mix, world: int, repeats: int, state: dict) -> tuple[list, int]:
    """Fresh loaders' orders (every rank) given `state`, and the position they took."""
    orders = [_order(mix, world, rank, repeats) for rank in range(world)]
    offsets = {order.restore(state) for order in orders}
    if len(offsets) != 1:
        raise Finding(f"mix_state: the ranks took other positions {sorted(offsets)} from one state")
    return orders, offsets.pop()


def _serve(orders: list, offset: int, epoch: int) -> tuple[dict, list[list[int]]]:
    """(the position as the loader saves it again, every rank's keys from it to the epoch's end)."""
    keys = [[int(k) for k in order.rank_indices(epoch, offset)] for order in orders]
    return {"epoch": epoch, **orders[0].save(offset, epoch)}, keys


def check_mix_state(data: bytes) -> None:
    import datapipe.mix.order  # noqa: F401 (imported before the clock starts, as the other targets do)

    start = time.process_time()
    if not data:
        return
    mode, world, repeats = data[0], 3 if data[0] & 2 else 1, 3 if data[0] & 4 else 1
    try:
        state = json.loads(data[1:])
    except (ValueError, RecursionError):  # not JSON: not a state this surface reads
        return
    try:
        orders, offset = _load(_mix(bool(mode & 1)), world, repeats, state)
    except ValueError as refused:
        if "\n" in str(refused) or len(str(refused)) > 1000:
            raise Finding(f"mix_state: a refusal of {len(str(refused))} characters over several lines") from None
        timed("mix_state", start)
        return
    saved, keys = _serve(orders, offset, state["epoch"])  # accepted: nothing may fail from here on
    _accepted_whole(state, saved)
    fresh = _mix(bool(mode & 1))  # another process: it asks the weights function anew
    again = _serve(*_load(fresh, world, repeats, json.loads(json.dumps(saved))), saved["epoch"])
    if again != (saved, keys):
        raise Finding(f"mix_state: an accepted state serves other keys than its position saved again ({saved})")
    _check_keys(fresh, keys, saved["epoch"], repeats)
    timed("mix_state", start)


def _accepted_whole(state: dict, saved: dict) -> None:
    """An accepted state had every key the loader writes for its position (a deleted key skips a check;
    weights_read and repeats are absent from states written before them: repeats then is 1, and a state
    saved with other repeats has counts that sum otherwise), an epoch >= 0 and a position within the epoch."""
    missing = set(saved["mix"]) - set(state["mix"]) - {"weights_read", "repeats"}
    if missing:
        raise Finding(f"mix_state: a state without mix{sorted(missing)} was accepted")
    if not (isinstance(state["epoch"], int) and state["epoch"] >= 0 and 0 <= state["samples_done"] <= EPOCH_SIZE):
        raise Finding(f"mix_state: epoch {state['epoch']!r}, samples_done {state['samples_done']!r} accepted")


def _check_keys(mix, keys: list[list[int]], epoch: int, repeats: int) -> None:
    """Every key is a record of the mix, and no source gives more than its count of the epoch (its draws
    times the repeats)."""
    flat = np.asarray([k for rank in keys for k in rank], np.int64)
    total = int(mix.starts[-1])
    if flat.size and (flat.min() < 0):
        raise Finding(f"mix_state: a negative key {int(flat.min())}")
    source = np.searchsorted(mix.starts, flat % total, side="right") - 1
    served = np.bincount(source, minlength=len(mix.names))
    draws = np.asarray(mix.counts(epoch, -(-EPOCH_SIZE // repeats)))
    if flat.size and (served > draws * repeats + len(keys)).any():  # + the ranks' padding
        raise Finding(f"mix_state: sources served {served.tolist()} past the epoch's draws {draws.tolist()} x {repeats}")


TARGET = Target("mix_state", check_mix_state, mix_state_seeds, ("datapipe.mix.state", "datapipe.mix.order"),
                memory=(64, 4 << 20))
