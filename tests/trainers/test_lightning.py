"""PyTorch Lightning with the real library (2 CPU ranks, gloo): a user returns make_loader(...) from
train_dataloader() and nothing else, under strategy="ddp" and "ddp_spawn"."""
from __future__ import annotations

from pathlib import Path

import pytest

from datapipe import open_dataset
from tests.conftest import installed
from tests.trainers.served import MID_STEP, STEPS_PER_EPOCH, check_epochs, run_script, served_after

if not installed("pytorch_lightning"):  # found, not imported: no pytest worker imports it at collection
    pytest.skip("pytorch_lightning is not installed", allow_module_level=True)
SCRIPT = Path(__file__).with_name("lightning_run.py")


def lightning(data, out, *args: str) -> dict[int, list[dict]]:
    return run_script(SCRIPT, data, out, *args)


def check_lightning_epochs(ranks: dict[int, list[dict]], size: int, epochs: int) -> None:
    """The common checks, and Lightning's progress total is len(loader) at every epoch start."""
    check_epochs(ranks, size, epochs)
    assert all(r["total"] == r["len"] for records in ranks.values() for r in records if "epoch_start" in r)


@pytest.fixture(scope="module")
def uninterrupted(packed_wds, tmp_path_factory):
    out = tmp_path_factory.mktemp("lightning") / "whole"
    return out, lightning(packed_wds, out, "--strategy", "ddp", "--save-step", str(MID_STEP), "--save-epoch", "0")


def test_ddp_every_epoch_complete_disjoint_and_new(packed_wds, uninterrupted):
    _, ranks = uninterrupted
    check_lightning_epochs(ranks, len(open_dataset(packed_wds)), 3)


@pytest.mark.parametrize("checkpoint, first_step", [("mid.ckpt", MID_STEP), ("epoch-end.ckpt", STEPS_PER_EPOCH)])
def test_ddp_resume_serves_exactly_what_the_uninterrupted_run_served(packed_wds, uninterrupted, tmp_path,
                                                                     checkpoint, first_step):
    """Trainer.fit(ckpt_path=...) from a mid-epoch and an epoch-end checkpoint: the same batches, crops
    included, as the run that went on; nothing served twice."""
    whole, ranks = uninterrupted
    resumed = lightning(packed_wds, tmp_path, "--strategy", "ddp", "--resume", str(whole / checkpoint))
    for rank in (0, 1):
        assert served_after(resumed[rank], 0) == served_after(ranks[rank], first_step)


def test_ddp_spawn_resumes_mid_epoch_and_serves_what_ddp_served(packed_wds, uninterrupted, tmp_path):
    """ddp_spawn starts the ranks in new processes (the module pickled into them), which make their
    loaders there: from the ddp run's mid-epoch checkpoint they serve what the ddp run went on to
    serve, to the end of the run, crops included."""
    whole, whole_ddp = uninterrupted
    resumed = lightning(packed_wds, tmp_path, "--strategy", "ddp_spawn", "--resume", str(whole / "mid.ckpt"))
    starts = [r for records in resumed.values() for r in records if "epoch_start" in r]
    assert sorted(r["epoch_start"] for r in starts) == [2, 2]  # Lightning resumes epoch 1 without its start hook
    assert all(r["total"] == r["len"] == STEPS_PER_EPOCH and r["world"] == 2 for r in starts)
    for rank in (0, 1):
        assert served_after(resumed[rank], 0) == served_after(whole_ddp[rank], MID_STEP)
