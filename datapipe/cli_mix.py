"""The command line's mixes: several dataset arguments (`NAME=PATH`, or named after the file) with
`--weights W1,W2,...` and `--epoch-size N` become a datapipe.Mix (docs/mixing.md)."""
from __future__ import annotations

import argparse
import math
from typing import Any

from .mix import mix_source


def add_mix_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--weights", metavar="W1,W2,...",
                        help="with several datasets: each one's weight, in order (default: their sizes, each record "
                             "once an epoch); docs/mixing.md")
    parser.add_argument("--epoch-size", type=int, metavar="N", help="with several datasets: samples an epoch "
                                                                    "(default: the sum of their sizes)")


def parse_weights(text: str | None, count: int) -> tuple[float, ...] | None:
    """--weights as floats, one per dataset; a one-line ValueError otherwise."""
    if text is None:
        return None
    try:
        weights = tuple(float(w) for w in text.split(","))
    except ValueError:
        raise ValueError(f"--weights takes numbers separated by commas, e.g. 0.7,0.3; got {text!r}") from None
    if len(weights) != count:
        raise ValueError(f"--weights gives {len(weights)} weight(s) for {count} dataset(s): give one per dataset, "
                         "in order")
    if any(not math.isfinite(w) or w < 0 for w in weights):
        raise ValueError(f"--weights must be finite numbers >= 0, got {text!r}")
    return weights


def source_of_args(data: list[str], weights: str | None, epoch_size: int | None, **mix_options: Any) -> Any:
    """The dataset arguments with --weights and --epoch-size: one path as it is, else their Mix."""
    return mix_source(data, parse_weights(weights, len(data)), epoch_size, **mix_options)


def mix_lines(mix: Any) -> list[str]:
    """`datapipe info`'s table of a mix: per source its records, weight, draws an epoch, epochs until it
    repeats a record."""
    rows = mix.table(0)
    width = max(len(r["source"]) for r in rows)
    lines = [f"mix of {len(rows)} sources, {len(mix):,} samples an epoch, {len(mix.classes)} classes",
             f"{'source':{width}}  {'records':>12}  {'weight':>7}  {'draws/epoch':>12}  {'epochs/pass':>11}  path"]
    for r in rows:
        passes = "never" if r["epochs_per_pass"] is None else f"{r['epochs_per_pass']:.2f}"
        lines.append(f"{r['source']:{width}}  {r['records']:>12,}  {r['weight']:>7.3f}  {r['draws']:>12,}  "
                     f"{passes:>11}  {r['path']}")
    lines.append("epochs/pass: epochs until a source repeats a record (below 1: it repeats within an epoch)")
    return lines
