"""Edges of the reference loop: fp16 steps the GradScaler skips, resumes with new flags."""
import torch

from datapipe.train import train
from datapipe.train.checkpoint import load
from datapipe.train.loop import resolve_amp
from tests.train.support import config, strict_json_lines


def test_fp16_runs_on_cpu_too():
    assert resolve_amp("fp16", torch.device("cpu")) == torch.float16


def test_fp16_with_skip_nonfinite_lets_the_grad_scaler_skip_steps_and_counts_them(learnable, tmp_path):
    """lr 1e30: after the first step the fp16 forward overflows, losses and gradients go inf/NaN."""
    metrics = train(config(learnable, tmp_path, epochs=1, amp="fp16", lr=1e30, warmup_epochs=0,
                           skip_nonfinite=True))
    record = metrics[0]
    assert record["nonfinite_losses"] > 0
    assert record["nonfinite_losses"] <= record["skipped_steps"] <= record["steps"] == 6
    assert strict_json_lines(tmp_path / "metrics.jsonl") == metrics
    saved = load(tmp_path / "last.pt")
    assert saved["skipped_steps"] == record["skipped_steps"]
    weights = [v for k, v in saved["model"].items() if not k.endswith(("running_mean", "running_var"))]
    assert all(bool(torch.isfinite(w.float()).all()) for w in weights)  # no NaN step reached the weights
