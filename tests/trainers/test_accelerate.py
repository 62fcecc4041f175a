"""Hugging Face Accelerate with the real library (2 CPU processes through notebook_launcher, gloo):
model and optimizer through accelerator.prepare, the loader as it is, its state carried by
register_for_checkpointing + save_state/load_state."""
from __future__ import annotations

from pathlib import Path

import pytest

from datapipe import open_dataset
from tests.conftest import installed
from tests.trainers.served import MID_STEP, STEPS_PER_EPOCH, check_epochs, run_script, served_after

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
