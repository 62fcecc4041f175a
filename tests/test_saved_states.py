"""States saved before the house moved (tests/saved_states/, written by the code at a97eded, before #49's
package layout) load and resume unchanged: a single dataset's loader state mid-epoch, a Mix's, and a
`datapipe train` checkpoint over the packed fixture. So do shard-wise states written at 8b2a9ad, before
shard interleaving's `mix_shards` was named `interleave_shards` (write_states.py --shards): a .wds's, whose
state holds the old key, and a Mix's with a .wds read shard by shard.

The loader states were written over the fixture folder converted as tests/conftest.py converts it (the
fingerprint in each state is that conversion's, so the session's packed datasets are the ones they
belong to). The checkpoint is resnet18 at 16 px after one step, its float tensors (weights, optimizer
buffers) zeroed and the file gzipped (~90 MB of random weights would not belong in the repository);
every other field is as that run wrote it, and its digest footer was written by that code's save.
"""
from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

from datapipe import Mix, make_loader
from datapipe.cli.main import main
from datapipe.train.checkpoint import load

STATES = Path(__file__).resolve().parent / "saved_states"
SMALL = dict(batch_size=5, image_size=32, num_workers=1)


def saved(name: str) -> dict:
    return json.loads((STATES / f"{name}.json").read_text())


def next_batch(loader, shown) -> dict:
    batch = next(iter(loader))
    return {f: [int(v) for v in getattr(batch, f)] for f in shown}


def fresh_at(source, state, shown, **extra) -> dict:
    """A loader that was never stopped, advanced to the saved position: its next batch."""
    loader = make_loader(source, backend="threads", **SMALL, **extra)
    loader.set_epoch(state["epoch"])
    it = iter(loader)
    for _ in range(state["batches_done"]):
        next(it)
    batch = next(it)
    return {f: [int(v) for v in getattr(batch, f)] for f in shown}


def test_a_single_dataset_loader_state_resumes_at_its_position(packed_lmdb):
    written = saved("loader_single")
    loader = make_loader(str(packed_lmdb), backend="threads", **SMALL)
    loader.load_state_dict(written["state"])
    got = next_batch(loader, ["indices"])
    assert got == written["next_batch"] == fresh_at(str(packed_lmdb), written["state"], ["indices"])


def test_a_mix_loader_state_resumes_at_its_position(packed_lmdb, packed_hdf5):
    written = saved("loader_mix")
    assert "mix" in written["state"]

    def mix():
        return Mix({"lm": str(packed_lmdb), "h5": str(packed_hdf5)}, weights={"lm": 0.6, "h5": 0.4})

    fields = dict(fields=("image", "label", "source"))
    loader = make_loader(mix(), backend="threads", **SMALL, **fields)
    loader.load_state_dict(written["state"])
    got = next_batch(loader, ["sources", "indices"])
    assert got == written["next_batch"] == fresh_at(mix(), written["state"], ["sources", "indices"], **fields)


SHARDS = dict(sampling="shards", interleave_shards=3)


def test_a_shard_wise_state_saved_under_the_old_key_resumes_at_its_position(packed_wds, caplog):
    written = saved("loader_shards")
    assert written["state"]["mix_shards"] == 3 and "interleave_shards" not in written["state"]
    loader = make_loader(str(packed_wds), backend="threads", **SMALL, **SHARDS)
    with caplog.at_level("WARNING", logger="datapipe"):
        loader.load_state_dict(written["state"])
    assert "saved with interleave_shards" not in caplog.text  # the old key read as the new one: 3, not 1
    got = next_batch(loader, ["indices"])
    assert got == written["next_batch"] == fresh_at(str(packed_wds), written["state"], ["indices"], **SHARDS)
    assert loader.state_dict()["interleave_shards"] == 3 and "mix_shards" not in loader.state_dict()


@pytest.mark.parametrize("key", ["interleave_shards", "mix_shards"])
@pytest.mark.parametrize("value", [None, "abc", True, -5, 2.7, float("nan"), [[2]], pytest.param(10**5000, id="huge")])
def test_a_damaged_interleave_key_is_refused_in_one_line_naming_it(packed_wds, key, value):
    state = {k: v for k, v in saved("loader_shards")["state"].items() if k != "mix_shards"} | {key: value}
    loader = make_loader(str(packed_wds), backend="threads", **SMALL, **SHARDS)
    with pytest.raises(ValueError, match=rf"cannot resume: the state's {key} is .*, not a number of shards") as caught:
        loader.load_state_dict(state)
    assert "\n" not in str(caught.value) and len(str(caught.value)) < 400


def test_a_mix_state_with_a_source_read_shard_by_shard_resumes_at_its_position(packed_wds, packed_lmdb):
    written = saved("loader_mix_shards")

    def mix():
        return Mix({"web": str(packed_wds), "lm": str(packed_lmdb)}, weights={"web": 0.6, "lm": 0.4})

    options = dict(fields=("image", "label", "source"), mix_shards=3, sampling="shards")  # the old keyword too
    loader = make_loader(mix(), backend="threads", **SMALL, **options)
    loader.load_state_dict(written["state"])
    got = next_batch(loader, ["sources", "indices"])
    assert got == written["next_batch"] == fresh_at(mix(), written["state"], ["sources", "indices"], **options)


def test_the_old_keyword_is_the_new_one_and_both_at_once_are_refused(packed_wds):
    old = make_loader(str(packed_wds), backend="threads", **SMALL, sampling="shards", mix_shards=3)
    new = make_loader(str(packed_wds), backend="threads", **SMALL, **SHARDS)
    assert old.options == new.options and old.options.interleave_shards == 3
    with pytest.raises(ValueError, match="both interleave_shards and mix_shards"):
        make_loader(str(packed_wds), backend="threads", **SMALL, **SHARDS, mix_shards=3)


def test_a_train_checkpoint_resumes(packed_lmdb, tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    with gzip.open(STATES / "train_last.pt.gz", "rb") as src, open(out / "last.pt", "wb") as dst:
        shutil.copyfileobj(src, dst)
    before = load(out / "last.pt")
    assert before["step"] == 1
    code = main(["train", str(packed_lmdb), "--out", str(out), "--resume", str(out / "last.pt"), "--workers", "1",
                 "--backend", "threads"])
    assert code == 0, capsys.readouterr().err
    after = load(out / "last.pt")
    assert after["step"] > before["step"]
    assert after["config"]["model"] == "resnet18" and after["config"]["image_size"] == before["config"]["image_size"]
