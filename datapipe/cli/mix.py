"""The command line's mixes: several dataset arguments (`NAME=PATH`, or named after the file) with
`--weights W1,W2,...` and `--epoch-size N` become a datapipe.Mix (docs/mixing.md)."""
from __future__ import annotations

import argparse
import math
import unicodedata
from typing import Any

from ..checks import shown
from ..errors import counted, plain
from ..mix.sources import mix_source


def add_mix_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--weights", metavar="W1,W2,...",
                        help="with several datasets: each one's weight, in order (default: their sizes, each record "
                             "once an epoch); docs/mixing.md")
    parser.add_argument("--epoch-size", type=int, metavar="N", help="with several datasets: samples an epoch "
                                                                    "(default: the sum of their sizes)")


def parse_weights(text: str | None, count: int) -> tuple[float, ...] | None:
    """--weights as floats, one per dataset (a Mix reads each as the decimal written: 0.7 is 7/10, so
    0.7,0.3 and 7,3 give the same counts); a one-line ValueError otherwise."""
    if text is None:
        return None
    parts = text.split(",")
    try:
        weights = tuple(float(w) for w in parts)
    except ValueError:
        raise ValueError(f"--weights takes numbers separated by commas, e.g. 0.7,0.3; got {shown(text)}") from None
    if len(weights) != count:
        raise ValueError(f"--weights gives {counted(len(weights), 'weight')} for {counted(count, 'dataset')}: give one per dataset, "
                         "in order")
    if any(not math.isfinite(w) or w < 0 for w in weights):
        raise ValueError(f"--weights must be finite numbers >= 0, got {shown(text)}")
    tiny = next((p for p, w in zip(parts, weights) if w == 0 and _nonzero(p)), None)
    if tiny is not None:
        raise ValueError(f"--weights {shown(tiny.strip())} is below the smallest float (it would read as 0 and skip "
                         "its dataset): scale the weights up together, e.g. 1,3 for 1e-400,3e-400")
    return weights


def _nonzero(text: str) -> bool:
    """Whether a number's text names a value other than 0 (a float may round it to 0): a digit 1-9 in
    its mantissa, in any script float() reads ("\u0661e-400" is 1e-400)."""
    mantissa = text.strip().lower().split("e")[0]
    return any(unicodedata.decimal(c, 0) > 0 for c in mantissa)


def source_of_args(data: list[str], weights: str | None, epoch_size: int | None, **mix_options: Any) -> Any:
    """The dataset arguments with --weights and --epoch-size: one path as it is, else their Mix."""
    return mix_source(data, parse_weights(weights, len(data)), epoch_size, **mix_options)


def mix_lines(mix: Any) -> list[str]:
    """`datapipe info`'s table of a mix: per source its records, weight, draws an epoch, epochs until it
    repeats a record. Names and paths as a terminal line shows them (a file name's escapes as text, a
    long one cut); --json has them whole."""
    rows = [{**r, "source": plain(r["source"], limit=64), "path": plain(r["path"])} for r in mix.table(0)]
    width = max(len("source"), *(len(r["source"]) for r in rows))  # names shorter than the header align too
    lines = [f"mix of {counted(len(rows), 'source')}, {len(mix):,} sample{'' if len(mix) == 1 else 's'} an epoch, "
             f"{counted(len(mix.classes), 'class', 'classes')}",
             f"{'source':{width}}  {'records':>12}  {'weight':>7}  {'draws/epoch':>12}  {'epochs/pass':>11}  path"]
    for r in rows:
        passes = "never" if r["epochs_per_pass"] is None else f"{r['epochs_per_pass']:.2f}"
        lines.append(f"{r['source']:{width}}  {r['records']:>12,}  {r['weight']:>7.3f}  {r['draws']:>12,}  "
                     f"{passes:>11}  {r['path']}")
    lines.append("epochs/pass: epochs until a source repeats a record (below 1: it repeats within an epoch)")
    return lines
