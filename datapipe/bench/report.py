"""Bench output: the terminal table, the JSON document, the bar chart."""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..storage.redaction import redact_json
from .suites import Row


def baseline_of(rows: list[Row], row: Row) -> Row | None:
    """The naive ImageFolder row measured on the same data in the same run."""
    return next((r for r in rows if r.data == row.data and r.backend == "naive-imagefolder" and r.images_per_s), None)


def table(rows: list[Row]) -> str:
    head = f"{'data':22} {'format':7} {'suite':9} {'backend':18} {'img/s':>8} {'MB/s':>8} {'x naive':>8} {'wait%':>6}"
    lines = [head, "-" * len(head)]
    for r in rows:
        base = baseline_of(rows, r)
        ratio = f"{r.images_per_s / base.images_per_s:8.2f}" if base and r.suite in ("pipeline", "baseline") else " " * 8
        mb = f"{r.mb_per_s:8.1f}" if r.mb_per_s is not None else " " * 8
        wait = f"{r.data_wait_pct:6.1f}" if r.data_wait_pct is not None else " " * 6
        rate = f"{r.images_per_s:8.0f}" if not r.note else "skipped"
        lines.append(f"{Path(r.data).name[:22]:22} {r.format[:7]:7} {r.suite:9} {r.backend[:18]:18} {rate:>8} {mb} "
                     f"{ratio} {wait}" + (f"  {r.note}" if r.note else ""))
    return "\n".join(lines)


def document(rows: list[Row], machine: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
    results = []
    for r in rows:
        base = baseline_of(rows, r)
        body = asdict(r)
        body["x_naive"] = round(r.images_per_s / base.images_per_s, 3) if base and r.images_per_s else None
        results.append(body)
    return {"machine": machine, "options": options, "results": results}


def write_json(path: Path, doc: dict[str, Any]) -> None:
    """The document as JSON, every string in it redacted (the options hold the URLs as typed)."""
    Path(path).write_text(json.dumps(redact_json(json.loads(json.dumps(doc, default=str))), indent=1), encoding="utf-8")


def plot(path: Path, rows: list[Row], title: str) -> None:
    """A horizontal bar chart of images/s per row (matplotlib, the `plot` extra)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ImportError("--plot needs matplotlib: pip install 'datapipe[plot]'") from exc
    # raw reads run ~50x faster than any decode and would flatten every other bar: table and JSON only
    shown = [r for r in rows if r.suite in ("pipeline", "baseline", "decode") and r.images_per_s]
    colors = {"pipeline": "tab:blue", "baseline": "tab:gray", "decode": "tab:orange"}
    fig, ax = plt.subplots(figsize=(9, 0.42 * len(shown) + 1.6))
    labels = [f"{Path(r.data).name} · {r.suite} · {r.backend}" for r in shown]
    ax.barh(labels, [r.images_per_s for r in shown], color=[colors[r.suite] for r in shown])
    for y, r in enumerate(shown):
        ax.text(r.images_per_s, y, f" {r.images_per_s:.0f}", va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("images / s (median)")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
