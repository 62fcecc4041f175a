"""A loader over a mix with a weights function: the function is asked once an epoch, in the main
process only (DataLoader workers, decode threads and DALI's source workers use its answers), and a
state carries the answers a resume serves."""
from __future__ import annotations

import collections
import os
from pathlib import Path

import pytest

from datapipe import Mix, make_loader


class Logged:
    """A weights function that writes (pid, epoch) for each call to a file (it travels to workers)."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __call__(self, epoch: int) -> dict[str, float]:
        with open(self.path, "a") as log:
            log.write(f"{os.getpid()} {epoch}\n")
        return {"a": 1 + epoch % 2, "b": 1}


def calls(path: Path) -> list[tuple[int, int]]:
    return [tuple(int(v) for v in line.split()) for line in path.read_text().splitlines()] if path.exists() else []


FIELDS = ("image", "label", "source")
RUNS = {"threads-2": dict(backend="threads", num_workers=2),
        "dataloader-2": dict(backend="dataloader", num_workers=2, start_method="fork"),
        "dali": dict(backend="dali", num_workers=2)}


@pytest.mark.parametrize("run", sorted(RUNS))
def test_the_weights_function_is_asked_once_an_epoch_in_the_main_process(packed_lmdb, packed_wds, tmp_path, run):
    if run == "dali":
        pytest.importorskip("nvidia.dali")
    log = tmp_path / "calls.txt"
    mix = Mix({"a": str(packed_lmdb), "b": str(packed_wds)}, weights=Logged(log), epoch_size=24)
    loader = make_loader(mix, batch_size=4, image_size=16, seed=1, fields=FIELDS, **RUNS[run])
    served = []
    for epoch in range(3):
        loader.set_epoch(epoch)
        served.append(collections.Counter(int(s) for b in loader for s in b.sources))
    assert [dict(c) for c in served] == [dict(enumerate(mix.counts(e))) for e in range(3)]
    got = calls(log)
    assert {pid for pid, _ in got} == {os.getpid()}, "a worker asked the weights function"
    assert collections.Counter(epoch for _, epoch in got) == {0: 1, 1: 1, 2: 1}


def test_a_resumed_loader_serves_the_states_answers(packed_lmdb, packed_wds, tmp_path):
    """Mid-epoch, the weights function changed since (a new process would ask it anew): the rest of the
    epoch is the state's counts, the function not asked for that epoch."""
    first = Mix({"a": str(packed_lmdb), "b": str(packed_wds)}, weights=Logged(tmp_path / "first.txt"), epoch_size=24)
    loader = make_loader(first, backend="threads", batch_size=4, image_size=16, seed=1, fields=FIELDS)
    batches = iter(loader)
    done = [int(s) for _ in range(2) for s in next(batches).sources]
    state = loader.state_dict()

    def later(epoch):
        return {"a": 1, "b": 5}

    resumed = make_loader(Mix({"a": str(packed_lmdb), "b": str(packed_wds)}, weights=later, epoch_size=24),
                          backend="threads", batch_size=4, image_size=16, seed=1, fields=FIELDS)
    resumed.load_state_dict(state)
    rest = [int(s) for b in resumed for s in b.sources]
    assert collections.Counter(done + rest) == dict(enumerate(first.counts(0)))


@pytest.mark.parametrize("edit, message", [
    (lambda s: s.update(mix=list(s["mix"])), r"the state's 'mix' must be a dict"),
    (lambda s: s["mix"]["draws_before"].update(a=10**30), r"the state's mix\['draws_before'\]\['a'\] must be within"),
    (lambda s: s["mix"].pop("counts"), r"the state's mix\['counts'\] is missing"),
    (lambda s: s.update(epoch=-5), r"the state's 'epoch' must be within 0\.\."),
], ids=["mix-a-list", "draws-1e30", "counts-deleted", "epoch-negative"])
def test_a_malformed_state_is_refused_by_load_state_dict_in_one_line(packed_lmdb, packed_wds, edit, message):
    """Was: an AttributeError (a list), an OverflowError at the first batch (10^30 draws), a mid-epoch
    state under other weights accepted (counts deleted), epoch -5 accepted."""
    def loader(weights):
        mix = Mix({"a": str(packed_lmdb), "b": str(packed_wds)}, weights=weights, epoch_size=24)
        return make_loader(mix, backend="threads", batch_size=4, image_size=16, seed=1)

    saving = loader({"a": 1, "b": 1})
    next(iter(saving))
    state = saving.state_dict()
    edit(state)
    with pytest.raises(ValueError, match="^cannot resume: " + message) as err:
        loader({"a": 1, "b": 2}).load_state_dict(state)
    assert "\n" not in str(err.value)
