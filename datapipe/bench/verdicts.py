"""Verdicts: what each knob bench measured did on this machine, in one word, and the setting to use.

A pure function of measured rows (no clock, no machine): tested with injected numbers.

Each comparison sets one row (a setting of a knob) against a reference row of the same run (e.g.
`pinned` against `pageable`, a backend against the one `auto` picks, a format against an image
folder). Repeats run round-robin, so repeat i of both rows ran in the same round: the effect is the
median of the per-repeat ratios setting/reference, and the spread is their range (min-max).

The noise rule: *helps* when every per-repeat ratio is above 1.0 and the median is at least
MIN_EFFECT above it; *hurts* the mirror image; *no effect* when every ratio lies within MIN_EFFECT of
1.0 (smaller than run-to-run drift on a shared machine lets 3 repeats resolve); otherwise *unsure*,
with the reason: one repeat (no spread to judge), or a spread too wide (the ratios straddle 1.0 or
stray further than MIN_EFFECT from it without an effect every repeat agrees on).

The recommended setting: the fastest setting that helps; where none does, datapipe's default
(advice.py) if it is among the settings that do not hurt, else the reference. An unsure line
recommends no change: its advice reads "keep the default, X", never the faster-looking setting. So
bench departs from the advice `datapipe doctor` prints only on a measured effect.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass

from .sanity import name_of
from .suites import Row

MIN_EFFECT = 0.03
WORDS = ("helps", "no effect", "hurts", "unsure")
RULE = (f"effect = median of the per-repeat ratios setting/reference (their range); helps/hurts = every ratio "
        f"above/below 1.0 and the median {MIN_EFFECT:.0%} or more away; no effect = every ratio within "
        f"{MIN_EFFECT:.0%} of 1.0; unsure = one repeat, or a spread too wide: keep the default")


@dataclass(frozen=True)
class Spec:
    """One knob's comparisons: rows of `suites` that carry `knob` in Row.knobs, compared within one
    dataset (or across datasets: `across_data`), holding the knobs in `hold` equal."""

    knob: str
    suites: tuple[str, ...]
    reference: str | None = None  # the setting compared against; None: the row that is datapipe's default
    across_data: bool = False
    hold: tuple[str, ...] = ()


SPECS = (
    Spec("format", ("read",), reference="folder", across_data=True),
    Spec("decode", ("decode",), reference="whole"),
    Spec("loader", ("baseline", "pipeline"), reference="naive-imagefolder"),
    Spec("backend", ("pipeline",)),
    Spec("format", ("pipeline",), reference="folder", across_data=True, hold=("backend",)),
    Spec("cuda_stream", ("pipeline",), reference="off"),
    Spec("pool_workers", ("pipeline",)),
    Spec("workers", ("loader",), hold=("prefetch_factor",)),
    Spec("prefetch_factor", ("loader",), hold=("workers",)),
    Spec("pinned_memory", ("h2d",), reference="pageable"),
)


@dataclass(frozen=True)
class Verdict:
    """`setting` against `reference` for `knob`: ratio (median) and its range over the repeats."""

    suite: str
    knob: str
    data: str
    setting: str
    reference: str
    ratio: float
    low: float
    high: float
    word: str
    repeats: int
    recommend: str  # the setting to use for this knob (the same on every line of one comparison group)
    row: int  # index of the setting's row in the rows judged (and in the JSON's results)
    reference_row: int
    advice: str = ""  # `recommend` in words: "use X" (measured), "keep the default, X", "keep X (the reference)"
    why: str = ""  # an unsure verdict's reason: "one repeat" or "spread too wide"

    @property
    def effect(self) -> str:
        return f"{self.ratio:.2f}x ({self.low:.2f}-{self.high:.2f})"

    @property
    def said(self) -> str:
        """The word as printed: "unsure (spread too wide)", "helps", ..."""
        return f"{self.word} ({self.why})" if self.why else self.word


def judge(setting_runs: list[float], reference_runs: list[float]) -> tuple[float, float, float, str]:
    """(median ratio, lowest, highest, word) from runs paired by repeat."""
    ratios = [s / r for s, r in zip(setting_runs, reference_runs) if r > 0]
    if not ratios:
        raise ValueError("no paired runs to compare: both rows need runs with images/s > 0")
    ratio, low, high = statistics.median(ratios), min(ratios), max(ratios)
    if len(ratios) < 2:
        word = "unsure"
    elif low > 1 and ratio >= 1 + MIN_EFFECT:
        word = "helps"
    elif high < 1 and ratio <= 1 - MIN_EFFECT:
        word = "hurts"
    elif 1 - MIN_EFFECT <= low and high <= 1 + MIN_EFFECT:
        word = "no effect"
    else:
        word = "unsure"
    return ratio, low, high, word


def _groups(rows: list[Row], spec: Spec) -> list[list[int]]:
    """Indices of the rows compared with each other, in row order, groups of 2 or more."""
    groups: dict[tuple, list[int]] = {}
    for i, r in enumerate(rows):
        if r.suite in spec.suites and spec.knob in r.knobs and r.runs and r.images_per_s > 0:
            key = ("" if spec.across_data else r.data, tuple(r.knobs.get(k) for k in spec.hold))
            groups.setdefault(key, []).append(i)
    return [g for g in groups.values() if len(g) > 1]


def _reference(rows: list[Row], group: list[int], spec: Spec) -> int:
    by_setting = [i for i in group if rows[i].knobs[spec.knob] == spec.reference]
    by_default = [i for i in group if spec.knob in rows[i].defaults]
    return (by_setting or by_default or group)[0]


def _compare(rows: list[Row], group: list[int], spec: Spec) -> list[Verdict]:
    ref = _reference(rows, group, spec)
    setting = {i: rows[i].knobs[spec.knob] for i in group}
    judged = {i: judge(rows[i].runs, rows[ref].runs) for i in group if i != ref}
    helps = [i for i in judged if judged[i][3] == "helps"]
    default = next((i for i in group if spec.knob in rows[i].defaults), None)
    if helps:
        chosen = max(helps, key=lambda i: judged[i][0])
        advice = f"use {setting[chosen]}"
    else:
        tied = [ref] + [i for i in judged if judged[i][3] != "hurts"]
        chosen = default if default in tied else ref
        advice = (f"keep the default, {setting[chosen]}" if chosen == default else
                  f"use {setting[chosen]} (the default, {setting[default]}, hurts)" if default is not None else
                  f"keep {setting[chosen]} (the reference)")
    found = []
    for i in judged:
        repeats = min(len(rows[i].runs), len(rows[ref].runs))
        why = "" if judged[i][3] != "unsure" else "one repeat" if repeats < 2 else "spread too wide"
        found.append(Verdict(rows[i].suite, spec.knob, name_of(rows[i].data), setting[i], setting[ref], *judged[i],
                             repeats=repeats, recommend=setting[chosen], row=i, reference_row=ref, advice=advice,
                             why=why))
    return found


def verdicts(rows: list[Row]) -> list[Verdict]:
    """Every comparison the rows allow, in SPECS order (read, decode, baseline, pipeline, loader, h2d)."""
    return [v for spec in SPECS for group in _groups(rows, spec) for v in _compare(rows, group, spec)]


def verdict_table(found: list[Verdict]) -> str:
    """The terminal table: one line per comparison, the rule underneath."""
    versus = [f"{v.setting} vs {v.reference}" for v in found]
    width = max([len(t) for t in versus] + [20])
    head = (f"{'suite':9} {'knob':16} {'data':18} {'setting vs reference':{width}} {'effect':19} {'verdict':24} "
            "recommend")
    lines = ["verdicts", head, "-" * len(head)]
    for v, text in zip(found, versus):
        lines.append(f"{v.suite:9} {v.knob:16} {v.data[:18]:18} {text:{width}} {v.effect:19} {v.said:24} {v.advice}")
    if not found:
        lines.append("(no two rows measured the same knob: run more suites, backends or datasets)")
    lines.append(RULE)
    return "\n".join(lines)
