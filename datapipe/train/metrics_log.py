"""OUT/metrics.jsonl: one strict-JSON line per finished epoch, exactly once whatever crashed when.

The run's metrics list lives in last.pt (state["metrics"]); the file is rewritten whole from it,
atomically, after each epoch's checkpoint and at resume. So a crash between the two writes never
shows twice: lines past the checkpoint are dropped at resume, a line the checkpoint has but the
file missed is written back. A few hundred bytes an epoch: rewriting even a long run's file is cheap.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..storage.durable import write_text

NAME = "metrics.jsonl"


def rewrite(out: Path, metrics: list[dict[str, Any]]) -> None:
    """OUT/metrics.jsonl as `metrics`, one line each (strict JSON, never a bare NaN)."""
    text = "".join(json.dumps(record, allow_nan=False) + "\n" for record in metrics)
    write_text(out / NAME, text, advice=f"free space there, then resume with --resume {out / 'last.pt'} "
                                        f"(it rewrites {NAME})")
