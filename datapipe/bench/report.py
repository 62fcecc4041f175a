"""Bench output: the terminal table, the JSON document, the bar chart."""
from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..errors import counted
from ..storage.redaction import redact_json
from .sanity import LOADER_SUITES, name_of
from .suites import Row
from .verdicts import RULE, Verdict


def baseline_of(rows: list[Row], row: Row) -> Row | None:
    """The naive ImageFolder row measured on the same data in the same run."""
    return next((r for r in rows if r.data == row.data and r.backend == "naive-imagefolder" and r.images_per_s), None)


def x_naive(rows: list[Row], row: Row) -> float | None:
    """A loader row's images/s over the naive loader's on the same data (None: no such pair of figures;
    a read or decode row is not a loader: records/s over images/s of a loader would mean nothing)."""
    base = baseline_of(rows, row)
    return row.images_per_s / base.images_per_s if base and row.images_per_s and row.suite in LOADER_SUITES else None


def _cell(value: float | None, width: int, digits: int, scale: float = 1.0) -> str:
    return f"{value / scale:{width}.{digits}f}" if value is not None else " " * width


def table(rows: list[Row]) -> str:
    """One line per row. KB/img: the bytes MB/s counts per image (a record read; for backend="ray" the
    host batch received, so MB/s is the network rate the pool needs). CPU per image: `trainer` is this
    process's, `pool` the loader's workers' wherever they run (meter.py). A row without a figure prints
    "-" and says why (skipped, failed, too short)."""
    head = (f"{'data':22} {'format':7} {'suite':9} {'backend':18} {'img/s':>8} {'MB/s':>8} {'x naive':>8} {'wait%':>6} "
            f"{'KB/img':>7} {'trainer cpu ms/img':>18} {'pool cpu ms/img':>15}")
    lines = [head, "-" * len(head)]
    for r in rows:
        ratio = x_naive(rows, r)
        rate = f"{r.images_per_s:8.0f}" if r.images_per_s else "-"
        cells = [_cell(r.mb_per_s, 8, 1), _cell(ratio, 8, 2), _cell(r.data_wait_pct, 6, 1),
                 _cell(r.bytes_per_image or None, 7, 1, 1e3), _cell(r.trainer_cpu_ms_per_image, 18, 2),
                 _cell(r.pool_cpu_ms_per_image, 15, 2)]
        line = f"{name_of(r.data)[:22]:22} {r.format[:7]:7} {r.suite:9} {r.backend[:18]:18} {rate:>8} "
        lines.append((line + " ".join(cells) + (f"  {r.note}" if r.note else "")).rstrip())
    return "\n".join(lines)


def document(rows: list[Row], machine: dict[str, Any], options: dict[str, Any],
             found: Sequence[Verdict] = ()) -> dict[str, Any]:
    """The JSON body: machine, options, one result per row, and the verdicts (`row` indexes results).
    A row without a figure has images_per_s null and its note says why."""
    results = []
    for r in rows:
        body, ratio = asdict(r), x_naive(rows, r)
        body["x_naive"] = round(ratio, 3) if ratio is not None else None
        body["images_per_s"] = r.images_per_s or None
        results.append(body)
    verdicts = [asdict(v) | {"ratio": round(v.ratio, 3), "low": round(v.low, 3), "high": round(v.high, 3)}
                for v in found]
    return {"machine": machine, "options": options, "results": results, "verdicts": verdicts, "verdict_rule": RULE}


def write_json(path: Path, doc: dict[str, Any]) -> None:
    """The document as JSON, every string in it redacted (the options hold the URLs as typed)."""
    Path(path).write_text(json.dumps(redact_json(json.loads(json.dumps(doc, default=str))), indent=1), encoding="utf-8")


SUITE_COLORS = {"decode": "tab:orange", "baseline": "tab:gray", "pipeline": "tab:blue", "loader": "tab:purple"}
WORD_COLORS = {"helps": "tab:green", "no effect": "dimgray", "hurts": "tab:red", "unsure": "goldenrod"}


def figure(rows: list[Row], title: str, found: Sequence[Verdict] = ()):
    """A horizontal bar chart of images/s per row, each bar followed by its figure and the verdicts
    of the setting it measured (colored by word), with a legend of suites and words."""
    try:
        from matplotlib.figure import Figure  # no pyplot: no global state, no GUI backend
        from matplotlib.patches import Patch
    except ImportError as exc:
        raise ImportError("--plot needs matplotlib: pip install 'datapipe[plot]'") from exc
    # raw reads run ~50x faster than any decode and would flatten every other bar: table and JSON only
    shown = [i for i, r in enumerate(rows) if r.suite in SUITE_COLORS and r.images_per_s]
    fig = Figure(figsize=(11, 0.42 * len(shown) + 2.2))
    ax = fig.subplots()
    labels = [f"{name_of(rows[i].data)} · {rows[i].suite} · {rows[i].backend}" for i in shown]
    ax.barh(labels, [rows[i].images_per_s for i in shown], color=[SUITE_COLORS[rows[i].suite] for i in shown])
    for y, i in enumerate(shown):
        ax.text(rows[i].images_per_s, y, f" {rows[i].images_per_s:.0f}", va="center", fontsize=8)
        said = [v for v in found if v.row == i]
        for k, v in enumerate(said):  # one line per verdict, stacked within the bar's height
            at = (rows[i].images_per_s, y + (k - (len(said) - 1) / 2) * 0.36)
            ax.annotate(f"{v.said} {v.ratio:.2f}x vs {v.reference}", at, xytext=(30, 0), textcoords="offset points",
                        va="center", fontsize=8 if len(said) == 1 else 7, color=WORD_COLORS[v.word])
    ax.set_xlim(0, max([rows[i].images_per_s for i in shown], default=1) * 1.6)  # room for the verdicts
    ax.invert_yaxis()
    left_out = sum(1 for r in rows if r.suite in SUITE_COLORS and not r.images_per_s)
    ax.set_xlabel("images / s (median of the repeats)" + (f"\n{counted(left_out, 'row')} without a figure (too short, failed "
                                                           "or skipped) left out: the table says why" if left_out else ""))
    ax.set_title(title, fontsize=10)
    handles = [Patch(color=c, label=s) for s, c in SUITE_COLORS.items() if any(rows[i].suite == s for i in shown)]
    words = {v.word for v in found if v.row in shown}  # the legend names the words the bars carry
    handles += [Patch(color=c, label=f"verdict: {w}") for w, c in WORD_COLORS.items() if w in words]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    fig.tight_layout()
    return fig


def plot(path: Path, rows: list[Row], title: str, found: Sequence[Verdict] = ()) -> None:
    """figure() written as a PNG."""
    figure(rows, title, found).savefig(path, dpi=120)
