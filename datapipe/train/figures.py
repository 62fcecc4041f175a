"""A run's figures: an epoch's running sums, and the one line every run ends with, however it ends
(its last epoch, --max-steps, a stop signal, an error), saying what it trained."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..errors import counted

# How a run ended -> the words of its last line
ENDINGS = {"epochs": "finished", "max_steps": "stopped at --max-steps", "preempted": "stopped by a signal",
           "error": "stopped by an error", "interrupted": "interrupted"}


@dataclass
class EpochSums:
    """Running totals of one epoch on this rank. A checkpoint holds loss_sum and images summed over
    ranks (rank 0 takes them back, the others start at 0: right at any world size) and rank 0's
    wait and seconds (per-rank figures: every rank takes them back)."""

    loss_sum: float = 0.0
    images: int = 0
    wait: float = 0.0
    seconds: float = 0.0
    correct: float = 0.0  # train images classified right (top-1, before the step)


def finite(value: float | None) -> float | None:
    """A figure for strict JSON: None where it is inf or NaN (a loss the guard let through)."""
    return value if value is None or math.isfinite(value) else None


def end_line(ended: str, *, steps: int, epochs_done: int, epochs: int, max_steps: int | None,
             last: dict[str, Any] | None) -> str:
    """'datapipe train stopped at --max-steps 2: 2 steps, 1 of 1 epoch finished; epoch 0: loss 1.0986,
    acc 0.375, val_acc n/a, 85 img/s, data wait 12.3% (dataloader)'. `last`: the last metrics.jsonl
    record (an unfinished epoch's has "partial"), None when no step was trained."""
    how = ENDINGS[ended] + (f" {max_steps}" if ended == "max_steps" else "")
    head = f"datapipe train {how}: {counted(steps, 'step')}, {epochs_done} of {counted(epochs, 'epoch')} finished"
    if last is None:
        return head + "; no step trained"
    return f"{head}; {epoch_summary(last)}"


def epoch_summary(record: dict[str, Any]) -> str:
    """'epoch 0: loss 1.0986, acc 0.375, val_acc n/a, 85 img/s, data wait 12.3% (dataloader)': a
    metrics.jsonl record for a log line (the record itself is in the file)."""
    shown = {k: "n/a" if record.get(k) is None else f"{record[k]:{spec}}"
             for k, spec in (("train_loss", ".4f"), ("train_acc", ".3f"), ("val_acc", ".3f"),
                             ("images_per_s", ".0f"), ("data_wait_pct", ".1f"))}
    part = f" (unfinished: {counted(record['images'], 'image')})" if record.get("partial") else ""
    pool = f", pool {record['pool_workers']}" if record.get("pool_workers") is not None else ""
    return (f"epoch {record['epoch']}{part}: loss {shown['train_loss']}, acc {shown['train_acc']}, val_acc "
            f"{shown['val_acc']}, {shown['images_per_s']} img/s, data wait {shown['data_wait_pct']}% "
            f"({record['backend']}{pool})")
