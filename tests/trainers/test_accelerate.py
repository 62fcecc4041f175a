"""Hugging Face Accelerate with the real library (2 CPU processes under torchrun, gloo):
model and optimizer through accelerator.prepare, the loader as it is, its state carried by
register_for_checkpointing + save_state/load_state; over a datapipe.Mix, a state saved mid-epoch by
2 processes loaded by 3."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from datapipe import open_dataset
from tests.conftest import installed
from tests.trainers.mixed import check_resumed, check_sequence, data_of, mix_spec, sequence_of
from tests.trainers.served import (MID_STEP, STEPS_PER_EPOCH, check_epochs, read_ranks, run_script, run_to_end,
                                   served_after, steps)

if not installed("accelerate"):  # found, not imported: no pytest worker imports it at collection
    pytest.skip("accelerate is not installed", allow_module_level=True)
SCRIPT = Path(__file__).with_name("accelerate_run.py")


@pytest.fixture(scope="module")
def uninterrupted(packed_wds, tmp_path_factory):
    out = tmp_path_factory.mktemp("accelerate") / "whole"
    return out, run_script(SCRIPT, packed_wds, out, "--save-step", str(MID_STEP), "--save-epoch", "0",
                           "--prepare-loader")


def test_every_epoch_complete_disjoint_and_new_and_prepare_leaves_the_loader_alone(packed_wds, uninterrupted):
    check_epochs(uninterrupted[1], len(open_dataset(packed_wds)), 3)


@pytest.mark.parametrize("state, first_step", [("mid", MID_STEP), ("epoch-end", STEPS_PER_EPOCH)])
def test_load_state_resumes_exactly_what_the_uninterrupted_run_served(packed_wds, uninterrupted, tmp_path,
                                                                     state, first_step):
    whole, ranks = uninterrupted
    resumed = run_script(SCRIPT, packed_wds, tmp_path, "--resume", str(whole / state))
    for rank in (0, 1):
        assert served_after(resumed[rank], 0) == served_after(ranks[rank], first_step)


def test_a_mix_saved_mid_epoch_by_2_processes_resumes_on_3_with_each_sample_once(packed_lmdb, packed_wds, tmp_path):
    """Over a Mix (tests/trainers/mixed.py): 2 processes train to step 6 (epoch 1 after 2 of its 4
    batches) and save_state there; then 3 processes load_state and train the rest (one script, two
    launches). Sample by sample, (source, record, label, crop) is the mix's uninterrupted sequence at
    the positions each rank reads at its world size; each epoch's samples are all the mix's, none
    twice but the padding (the 11 samples left of epoch 1 over 3 ranks: one)."""
    spec, first, rest = mix_spec(packed_lmdb, packed_wds), tmp_path / "first", tmp_path / "rest"
    run_to_end([sys.executable, str(SCRIPT), spec, str(first), "--save-step", str(MID_STEP), "--max-steps",
                str(MID_STEP), "--then", spec, str(rest), "--resume", str(first / "mid"), "--processes", "3"], 300)
    before, after = read_ranks(first, 2), read_ranks(rest, 3)
    for records in before.values():
        assert [r["step"] for r in steps(records)] == list(range(MID_STEP))
    assert all([r for r in records if "epoch_start" in r] == [{"epoch_start": 1, "len": 3, "world": 3}]
               for records in after.values())
    mix = data_of(spec)
    sequence = sequence_of(mix, epochs=3, image_size=16)
    check_sequence(mix, sequence)
    check_resumed(sequence, before, after)
