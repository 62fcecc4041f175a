"""Edges of the reference loop: fp16 steps the GradScaler skips, resumes with new flags."""
import dataclasses
import logging

import pytest
import torch

from datapipe.cli.main import main
from datapipe.train import Trainer, train
from datapipe.train.checkpoint import load
from datapipe.train.config import warmup_cosine
from datapipe.train.loop import resolve_amp
from tests.train.support import config, strict_json_lines


def test_fp16_runs_on_cpu_too():
    assert resolve_amp("fp16", torch.device("cpu")) == torch.float16


def test_fp16_with_skip_nonfinite_lets_the_grad_scaler_skip_steps_and_counts_them(learnable, tmp_path):
    """lr 1e30: after the first step the fp16 forward overflows, losses and gradients go inf/NaN.
    16 px: fp16 backward on a CPU is slow (few fp16 kernels), and the overflow needs no more."""
    metrics = train(config(learnable, tmp_path, epochs=1, amp="fp16", lr=1e30, warmup_epochs=0,
                           skip_nonfinite=True, image_size=16))
    record = metrics[0]
    assert record["nonfinite_losses"] > 0
    assert record["nonfinite_losses"] <= record["skipped_steps"] <= record["steps"] == 6
    assert strict_json_lines(tmp_path / "metrics.jsonl") == metrics
    saved = load(tmp_path / "last.pt")
    assert saved["skipped_steps"] == record["skipped_steps"]
    weights = [v for k, v in saved["model"].items() if not k.endswith(("running_mean", "running_var"))]
    assert all(bool(torch.isfinite(w.float()).all()) for w in weights)  # no NaN step reached the weights


def test_a_resume_with_a_new_lr_and_epochs_follows_them_from_the_same_schedule_position(learnable, tmp_path, caplog):
    """6 steps per epoch, warm-up 3 steps. Stopped at step 8 of a 2-epoch run at lr 0.05, resumed for
    3 epochs at lr 0.1: the lr follows 0.1 x the 18-step schedule from step 8 on, and the log says so."""
    train(config(learnable, tmp_path, epochs=2, lr=0.05, max_steps=8))
    resumed = config(learnable, tmp_path, epochs=3, lr=0.1, resume=str(tmp_path / "last.pt"))
    with caplog.at_level(logging.INFO, logger="datapipe.train"):
        trainer = Trainer(resumed)
    assert trainer.step == 8
    assert [g["lr"] for g in trainer.optimizer.param_groups] == pytest.approx([0.1 * warmup_cosine(8, warmup=3, total=18)] * 2)
    assert "resume: lr 0.05 -> 0.1" in caplog.text and "resume: epochs 2 -> 3" in caplog.text
    train(dataclasses.replace(resumed, max_steps=10))
    saved = load(tmp_path / "last.pt")
    assert saved["step"] == 10 and saved["config"]["lr"] == 0.1
    expected = 0.1 * warmup_cosine(10, warmup=3, total=18)
    assert [g["lr"] for g in saved["optimizer"]["param_groups"]] == pytest.approx([expected] * 2)


def test_the_command_line_resumes_with_the_checkpoints_settings_unless_given_again(learnable, tmp_path, caplog):
    common = [learnable, "--out", str(tmp_path), "--workers", "1", "--backend", "dataloader", "--log-every", "5"]
    assert main(["train", *common, "--model", "resnet18", "--image-size", "32", "--batch-size", "12",
                 "--lr", "0.05", "--epochs", "2", "--warmup-epochs", "0.5", "--max-steps", "8"]) == 0
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="datapipe.train"):
        assert main(["train", *common, "--resume", str(tmp_path / "last.pt"), "--max-steps", "10"]) == 0
    assert "resume: " not in caplog.text  # nothing changed: model, size, batch, lr, epochs, warm-up kept
    saved = load(tmp_path / "last.pt")
    assert saved["step"] == 10 and saved["config"]["model"] == "resnet18"
    expected = 0.05 * warmup_cosine(10, warmup=3, total=12)
    assert [g["lr"] for g in saved["optimizer"]["param_groups"]] == pytest.approx([expected] * 2)
