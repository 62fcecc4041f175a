"""The command line's mixes: several dataset arguments (`NAME=PATH`, or named after the file) with
`--weights W1,W2,...` and `--epoch-size N` become a datapipe.Mix (docs/mixing.md)."""
from __future__ import annotations

import argparse
import math
import re
from typing import Any

NAMED = re.compile(r"^([A-Za-z0-9_.-]+)=(.+)$")


def add_mix_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--weights", metavar="W1,W2,...",
                        help="with several datasets: each one's weight, in order (default: their sizes, each record "
                             "once an epoch); docs/mixing.md")
    parser.add_argument("--epoch-size", type=int, metavar="N", help="with several datasets: samples an epoch "
                                                                    "(default: the sum of their sizes)")


def source_names(data: list[str]) -> dict[str, str]:
    """name -> path: `NAME=PATH` as given, else the path's last part (`in1k.lmdb`, `web.wds`, `photos`),
    made unique with -2, -3, ... where two are alike."""
    out: dict[str, str] = {}
    for item in data:
        named = NAMED.match(item)
        if named and "://" not in item.split("=", 1)[0]:
            name, path = named[1], named[2]
        else:
            path = item
            name = re.sub(r"[^A-Za-z0-9_.-]", "_", item.rstrip("/").rsplit("/", 1)[-1]) or "data"
        base, k = name, 2
        while name in out:
            name, k = f"{base}-{k}", k + 1
        out[name] = path
    return out


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


def mix_source(data: list[str], weights: Any, epoch_size: int | None, **mix_options: Any) -> Any:
    """One path as it is, or the Mix of several (or of one given --weights / --epoch-size)."""
    weights = parse_weights(weights, len(data)) if isinstance(weights, str) else weights
    if len(data) == 1 and weights is None and epoch_size is None:
        return data[0]
    from .mix import Mix

    sources = source_names(list(data))
    given = None if weights is None else dict(zip(sources, weights))
    return Mix(sources, weights=given, epoch_size=epoch_size, **mix_options)


def mix_lines(mix: Any) -> list[str]:
    """`datapipe info`'s table of a mix: per source its records, weight, draws an epoch, epochs until it
    repeats a record."""
    rows = mix.table(0)
    width = max(len(r["source"]) for r in rows)
    lines = [f"mix of {len(rows)} sources, {len(mix):,} samples an epoch, {len(mix.classes)} classes",
             f"{'source':{width}}  {'records':>12}  {'weight':>7}  {'draws/epoch':>12}  {'epochs/pass':>11}  path"]
    for r in rows:
        passes = "never" if math.isinf(r["epochs_per_pass"]) else f"{r['epochs_per_pass']:.2f}"
        lines.append(f"{r['source']:{width}}  {r['records']:>12,}  {r['weight']:>7.3f}  {r['draws']:>12,}  "
                     f"{passes:>11}  {r['path']}")
    lines.append("epochs/pass: epochs until a source repeats a record (below 1: it repeats within an epoch)")
    return lines
