"""The reference loop on CPU: it learns, DDP keeps ranks identical, resume equals an unbroken run."""
import json
import sys
from pathlib import Path

import pytest
import torch

from datapipe.train import train
from datapipe.train.checkpoint import load
from tests.processes import run_in_session
from tests.train.support import config, free_port, strict_json_lines

ROOT = Path(__file__).resolve().parents[2]
HANG_S = 300  # each run takes 15-45 s here; past this it hangs, and the failure shows every process's stacks


def test_a_few_epochs_learn_clearly_above_chance(learnable, tmp_path):
    metrics = train(config(learnable, tmp_path))
    assert [m["epoch"] for m in metrics] == [0, 1, 2]
    assert metrics[-1]["val_acc"] >= 0.8  # chance is 1/3
    assert metrics[-1]["train_loss"] < metrics[0]["train_loss"]
    lines = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert lines == metrics
    for key in ("epoch", "train_loss", "val_acc", "images_per_s", "data_wait_pct", "world_size", "backend", "lr"):
        assert key in lines[0]
    assert 0 <= lines[0]["data_wait_pct"] <= 100 and lines[0]["world_size"] == 1
    assert set(load(tmp_path / "last.pt")) >= {"model", "optimizer", "scaler", "scheduler", "loader"}


def test_resume_mid_epoch_matches_an_uninterrupted_run(learnable, tmp_path):
    train(config(learnable, tmp_path / "whole", epochs=2))
    steps_per_epoch = 6  # 72 train images / 12
    train(config(learnable, tmp_path / "broken", epochs=2, max_steps=steps_per_epoch + 2))
    stopped = load(tmp_path / "broken" / "last.pt")
    assert stopped["epoch"] == 1 and stopped["loader"]["batches_done"] == 2
    train(config(learnable, tmp_path / "broken", epochs=2, resume=str(tmp_path / "broken" / "last.pt")))
    whole, resumed = load(tmp_path / "whole" / "last.pt"), load(tmp_path / "broken" / "last.pt")
    assert resumed["step"] == whole["step"] == 2 * steps_per_epoch
    for name, tensor in whole["model"].items():
        assert torch.allclose(tensor.float(), resumed["model"][name].float(), rtol=1e-4, atol=1e-5), name
    assert resumed["metrics"][-1]["val_acc"] == whole["metrics"][-1]["val_acc"]


@pytest.mark.parametrize("backend", ["threads", "dataloader", "prefetch", "dali"])
def test_an_epoch_through_every_backend(learnable, tmp_path, backend):
    metrics = train(config(learnable, tmp_path, epochs=1, backend=backend))
    assert metrics[0]["backend"] == backend and metrics[0]["val_acc"] is not None
    assert strict_json_lines(tmp_path / "metrics.jsonl") == metrics
    assert metrics[0]["nonfinite_losses"] == 0 and metrics[0]["skipped_records"] == 0


def test_a_nonfinite_loss_is_an_error_naming_epoch_and_step_or_is_skipped_and_counted(learnable, tmp_path):
    from datapipe.train.guard import NonFiniteLoss

    with pytest.raises(NonFiniteLoss, match=r"non-finite training loss \(inf or NaN\) in epoch 0 at step \d+"):
        train(config(learnable, tmp_path / "raise", epochs=1, lr=1e30, warmup_epochs=0))
    metrics = train(config(learnable, tmp_path / "skip", epochs=1, lr=1e30, warmup_epochs=0, skip_nonfinite=True))
    assert 0 < metrics[0]["nonfinite_losses"] <= metrics[0]["skipped_steps"]
    assert strict_json_lines(tmp_path / "skip" / "metrics.jsonl") == metrics


def test_a_lone_last_sample_does_not_reach_batchnorm(learnable, tmp_path):
    """72 train images at batch 71: the last batch would hold one sample; training drops it."""
    metrics = train(config(learnable, tmp_path, epochs=1, batch_size=71))
    assert metrics[0]["steps"] == 1 and metrics[0]["val_acc"] is not None


def test_gradient_accumulation_and_profile_trace(learnable, tmp_path):
    metrics = train(config(learnable, tmp_path, epochs=1, accum_steps=2, profile=True))
    assert metrics[0]["steps"] == 3  # 6 batches, 2 per optimizer step
    traces = list((tmp_path / "profile").glob("*.json*"))
    assert traces and traces[0].stat().st_size > 1000


def test_two_process_gloo_run_through_torchrun_ends_with_identical_weights(learnable, tmp_path):
    """gloo on CPU. On a machine with one GPU both ranks share it, and ddp.setup uses gloo there too
    (NCCL refuses two ranks on one GPU: "Duplicate GPU detected"); with two or more GPUs it is NCCL."""
    port = free_port()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(port),
           "-m", "datapipe", "train", learnable, "--model", "resnet18", "--epochs", "2", "--batch-size", "6",
           "--image-size", "32", "--lr", "0.05", "--workers", "1", "--backend", "dataloader", "--out", str(tmp_path)]
    run_in_session(cmd, HANG_S, cwd=ROOT)
    summary = json.loads((tmp_path / "summary.json").read_text())
    digests = summary["weights_digest_per_rank"]
    assert len(digests) == 2 and digests[0] == digests[1]
    metrics = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 2 and all(m["world_size"] == 2 for m in metrics)
    assert metrics[-1]["val_acc"] is not None
    assert len(list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))) == 1  # rank 0 only


@pytest.mark.full  # make test-full and CI; elastic resumes are in make test (test_ranks.py)
def test_two_rank_dali_run_over_uneven_shards_then_elastic_resume_on_one(packed_wds, tmp_path):
    """DALI under torchrun (gloo) over shards of 13 and 14 records at batch 13: every rank gets a
    full batch (none empty, no NaN); stopped after one step, the run resumes on one process. With
    fewer GPUs than ranks, ddp.setup uses gloo (ranks share a GPU); with two or more, NCCL."""
    port = free_port()
    common = ["-m", "datapipe", "train", str(packed_wds), "--model", "resnet18", "--epochs", "2", "--batch-size", "13",
              "--image-size", "32", "--lr", "0.05", "--workers", "1", "--backend", "dali", "--out", str(tmp_path)]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(port), *common, "--max-steps", "1"]
    run_in_session(cmd, HANG_S, cwd=ROOT)
    stopped = load(tmp_path / "last.pt")
    # 26 of 27 records served: at world size 2 with drop_last no batch is left, so the step ended epoch 0,
    # which is finished as any other (evaluated, its metrics line written) and the loader stands at epoch 1
    assert stopped["world_size"] == 2 and stopped["epoch"] == 1 and len(stopped["metrics"]) == 1
    assert (stopped["loader"]["epoch"], stopped["loader"]["samples_done"]) == (1, 0)
    run_in_session([sys.executable, *common, "--resume", str(tmp_path / "last.pt")], HANG_S, cwd=ROOT)
    metrics = strict_json_lines(tmp_path / "metrics.jsonl")
    assert [m["epoch"] for m in metrics] == [0, 1] and metrics[1]["world_size"] == 1
    # steps are recounted at the new world size (27 // 13 = 2 per epoch): epoch 0 was done, so 2 + 2
    assert metrics[1]["steps"] == 4
    assert all(m["val_acc"] is not None and m["nonfinite_losses"] == 0 for m in metrics)


def test_clear_errors(learnable, tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint at"):
        train(config(learnable, tmp_path, resume=str(tmp_path / "nope.pt")))
    with pytest.raises(ValueError, match="epochs must be >= 1"):
        config(learnable, tmp_path, epochs=0)
