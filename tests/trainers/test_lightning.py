"""PyTorch Lightning with the real library (2 CPU ranks, gloo): a user returns make_loader(...) from
train_dataloader() and nothing else, under strategy="ddp" and "ddp_spawn"; over a datapipe.Mix, a
mid-epoch checkpoint of 2 ranks resumed on 1."""
from __future__ import annotations

from pathlib import Path

import pytest

from datapipe import open_dataset
from tests.conftest import installed
from tests.trainers.mixed import check_resumed, check_sequence, data_of, mix_spec, sequence_of
from tests.trainers.served import (MID_STEP, STEPS_PER_EPOCH, check_epochs, read_ranks, run_script, served_after,
                                   steps)

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


def test_ddp_resume_from_the_epoch_end_serves_exactly_what_the_uninterrupted_run_served(packed_wds, uninterrupted,
                                                                                       tmp_path):
    """Trainer.fit(ckpt_path=...) from an epoch-end checkpoint: the same batches, crops included, as the
    run that went on; nothing served twice. (A mid-epoch one: ddp_spawn's test below, and the mix's.)"""
    whole, ranks = uninterrupted
    resumed = lightning(packed_wds, tmp_path, "--strategy", "ddp", "--resume", str(whole / "epoch-end.ckpt"))
    for rank in (0, 1):
        assert served_after(resumed[rank], 0) == served_after(ranks[rank], STEPS_PER_EPOCH)


@pytest.mark.full  # make test-full and CI; ddp's own resume is in make test
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


@pytest.mark.full  # make test-rest and CI; a Mix's elastic resume through a trainer is in make test: test_accelerate.py
def test_a_mix_checkpointed_mid_epoch_on_2_ranks_resumes_on_1_with_each_sample_once(packed_lmdb, packed_wds,
                                                                                   tmp_path, within):
    """Over a Mix (tests/trainers/mixed.py): 2 ddp ranks train to step 6 (epoch 1 after 2 of its 4
    batches) and Lightning checkpoints there; Trainer.fit(ckpt_path=...) on 1 device (in this process)
    trains the rest. Sample by sample, (source, record, label, crop) is the mix's uninterrupted
    sequence at the positions each rank reads at its world size, and each epoch's samples are all
    the mix's, none twice but the padding."""
    spec = mix_spec(packed_lmdb, packed_wds)
    first = lightning(spec, tmp_path / "first", "--strategy", "ddp", "--save-step", str(MID_STEP),
                      "--max-steps", str(MID_STEP))
    from tests.trainers.lightning_run import main

    main([spec, str(tmp_path / "rest"), "--strategy", "auto", "--devices", "1", "--resume",
          str(tmp_path / "first" / "mid.ckpt")])
    rest = read_ranks(tmp_path / "rest", 1)[0]
    mix = data_of(spec)
    sequence = sequence_of(mix, epochs=3, image_size=16)
    check_sequence(mix, sequence)
    check_resumed(sequence, first, {0: rest})
    for records in first.values():
        assert [r["step"] for r in steps(records)] == list(range(MID_STEP))
    assert [r["step"] for r in steps(rest)] == list(range(MID_STEP, MID_STEP + 3 + 7))  # 11 samples, then 27
    assert [r for r in rest if "epoch_start" in r] == [{"epoch_start": 2, "total": 7, "len": 7, "world": 1}]
