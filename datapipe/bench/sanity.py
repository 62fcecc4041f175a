"""Which rows are throughputs: a figure is printed only where the window could measure one.

A loader's workers start decoding before the clock does: after the warm-up, each may have a batch or
more ready (prefetch_factor bounds it), which the window then receives for free. Over N batches per
worker that look-ahead is worth about 1/N of the figure, so a loader row needs MIN_BATCHES_PER_WORKER
(50: under 2%, below the 3% the verdicts resolve) batches per worker inside its window. On a dataset
shorter than that the workers had most of the epoch decoded before the timer started (a 124-record
sample printed 30x the threads row and far above one core's decode rate times the cores). Such a row is
marked "too short" with what it needs, prints no figure and gives no verdict.

A second check, on the rows that decode on this machine's CPU: no row can outrun every core decoding at
the rate the decode suite measured for one. A row above DECODE_SLACK x cores x that rate (the same data
and image size) is not a throughput either; the slack leaves room for drift between the two rows.
"""
from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import counted, plain
from .window import DRAIN_BATCHES, Timing

if TYPE_CHECKING:
    from .suites import BenchOptions, Row

MIN_BATCHES_PER_WORKER = 50
DECODE_SLACK = 1.5
LOADER_SUITES = ("baseline", "pipeline", "loader")
CPU_DECODERS = ("threads", "dataloader", "prefetch", "naive-imagefolder")  # + DALI's rows without CUDA


def name_of(data: str) -> str:
    """A dataset's name as a terminal line shows it (a folder named with escapes prints them as text)."""
    return plain(Path(data).name, 60)


def records_needed(workers: int, opts: BenchOptions) -> int:
    """Records an epoch needs for a window of opts.min_batches batches per worker after the warm-up."""
    return (opts.min_batches * max(1, workers) + opts.warmup + DRAIN_BATCHES) * opts.batch_size


def too_short(timings: Sequence[Timing], workers: int, opts: BenchOptions,
              records: int | None = None) -> tuple[str, int | None] | None:
    """(the row's note, records needed or None where more records are not the fix) when a run's window
    held under opts.min_batches batches per worker (`workers` 0: a suite without look-ahead, which needs
    1 batch). `records`: the dataset's. The fix named is the first that applies: more records (the
    dataset is shorter than a window needs), or none (the epoch ended sooner than its records allow: the
    loader skipped them), or more --seconds (the clock ended the window)."""
    counted = [t for t in timings if t.batches is not None]
    if not counted:
        return None
    worst = min(counted, key=lambda t: t.batches)
    per_worker = worst.batches / max(1, workers)
    need = opts.min_batches if workers else 1
    if per_worker >= need:
        return None
    shown = round(per_worker, 1) if workers else worst.batches
    timed = f"{shown:g} {'batch' if shown == 1 else 'batches'}{' per worker' if workers else ''} timed"
    needed = records_needed(workers, opts) if workers else (opts.warmup + DRAIN_BATCHES + 1) * opts.batch_size
    ended = any(t.ended for t in counted if t.batches / max(1, workers) < need)
    if (records is None and ended) or (records is not None and records < needed):
        who = f" and {workers} worker{'s' if workers > 1 else ''}" if workers else ""
        smaller = ", or a smaller --batch-size" if opts.batch_size > 1 else ""
        return (f"too short: {timed}, needs >= {need}: >= {needed:,} records at batch {opts.batch_size}{who}"
                f"{smaller}"), needed
    if ended:
        return (f"too short: {timed}, needs >= {need}; its {records:,} records would give enough: the loader "
                "skipped most as unreadable"), None
    seconds = math.ceil(opts.seconds * need / max(per_worker, 0.5))
    return f"too short: {timed} in {opts.seconds:g} s, needs >= {need}: --seconds {seconds} or more", None


def beyond_decode(rows: list[Row], cores: int, cuda: bool) -> None:
    """Mark the rows that decode on this CPU and ran faster than `cores` x DECODE_SLACK x the best
    train-view decode rate measured on the same data (rows and verdicts then leave them out)."""
    decode = defaultdict(float)
    for r in rows:
        if r.suite == "decode" and r.backend.startswith("train-view") and r.images_per_s:
            decode[r.data] = max(decode[r.data], r.images_per_s)
    decoders = CPU_DECODERS + (() if cuda else ("dali", "plain-dali-cpu"))
    for r in rows:
        if (r.suite in LOADER_SUITES and r.backend.split()[0] in decoders and decode[r.data]
                and r.images_per_s > DECODE_SLACK * cores * decode[r.data]):
            r.note = (f"not a throughput: above {cores} cores x the {decode[r.data]:.0f} img/s one core decodes "
                      f"(decode suite, x{DECODE_SLACK} slack): the data decoded before the clock started?")
            r.images_per_s, r.runs, r.mb_per_s, r.data_wait_pct = 0.0, [], None, None
            r.trainer_cpu_ms_per_image = r.pool_cpu_ms_per_image = None


def short_data_lines(rows: list[Row]) -> list[str]:
    """One line per dataset whose loader rows were too short for its length: the records they need."""
    needs: dict[str, list[int]] = defaultdict(list)
    for r in rows:
        if r.needs_records:
            needs[r.data].append(r.needs_records)
    return [f"{name_of(data)} is too short to time {counted(len(n), 'row')}: they need >= {max(n):,} records at this "
            f"--batch-size, or a smaller --batch-size (their notes say why)" for data, n in needs.items()]


def no_figure(rows: list[Row]) -> str | None:
    """The one-line reason when no row produced a figure (None where one did)."""
    if any(r.images_per_s for r in rows):
        return None
    if not rows:
        return "no row to run: the suites chosen measure nothing here (h2d needs CUDA)"
    notes = defaultdict(list)
    for r in rows:
        notes[r.note].append(r)
    note, same = max(notes.items(), key=lambda kv: len(kv[1]))
    first = same[0]
    return (f"no row produced a figure; {len(same)} of {len(rows)} rows say, like {name_of(first.data)} "
            f"{first.suite} {first.backend}: {note or 'no runs'}")
