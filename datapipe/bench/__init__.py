"""`datapipe bench`: which format and backend to use on this machine, with figures, verdicts and a plot.
May import backends and every room below it; not train, doctor or cli."""
from __future__ import annotations

import logging
from pathlib import Path

import torch
from tqdm import tqdm

from ..errors import ExpectedError, first_line
from ..formats import open_dataset
from ..resources import available_cpus
from ..storage import redact
from .pool import ray_session
from .sanity import beyond_decode, name_of
from .settle import settle
from .suites import SUITES, BenchOptions, Case, Row
from .window import NoBatchLeft, Timing

log = logging.getLogger(__name__)


def run_bench(sources: list[str | Path], options: BenchOptions = BenchOptions(),
              suites: tuple[str, ...] = ("read", "decode", "baseline", "pipeline", "h2d"), *,
              progress: bool = False) -> list[Row]:
    """Run the suites on every source; rows come back in a stable order (source, then suite).
    `progress`: one bar over every timed run, naming the one running. The `loader` suite (num_workers,
    prefetch_factor) is not in the default list: 4 more loader rows per source. `verdicts.verdicts(rows)`
    reads the rows. With backend "ray" the bench runs on one Ray (bench/pool.py). A row that measured no
    throughput (too short a window, faster than the cores decode: sanity.py) says so in its note instead."""
    unknown = set(suites) - set(SUITES)
    if unknown:
        raise ValueError(f"unknown suites {sorted(unknown)}; choose from {sorted(SUITES)}")
    device = torch.device(options.device) if options.device else (
        torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu"))
    with ray_session("ray" in options.backends and "pipeline" in suites):
        rows = _run_cases(sources, options, suites, device, progress)
    beyond_decode(rows, available_cpus(), device.type == "cuda")
    return rows


def _run_cases(sources: list[str | Path], options: BenchOptions, suites: tuple[str, ...], device: torch.device,
               progress: bool) -> list[Row]:
    cases = []
    for source in sources:
        ds = open_dataset(source, options.split, cache_dir=options.cache_dir, cache_limit=options.cache_limit)
        for suite in suites:
            cases += SUITES[suite](redact(source), ds, options, device)  # rows, logs and JSON show no secret
        for case in cases:
            case.records = len(ds) if case.records is None else case.records
    results: dict[int, list[Timing]] = {id(c): [] for c in cases}
    runnable = [c for c in cases if c.run is not None]
    with tqdm(total=options.repeats * len(runnable), desc="bench", unit="run", disable=not progress) as bar:
        for repeat in range(options.repeats):  # round-robin: drift on a shared machine hits every row alike
            for case in runnable:
                if case.run is None:  # it failed in an earlier repeat
                    bar.update(1)
                    continue
                bar.set_postfix_str(f"repeat {repeat + 1}/{options.repeats}: {name_of(case.data)} {case.suite} "
                                    f"{case.backend}", refresh=False)
                log.debug("bench repeat %d/%d: %s %s %s", repeat + 1, options.repeats, case.data, case.suite,
                          case.backend)
                try:
                    results[id(case)].append(case.run(repeat))
                except ExpectedError:  # a worker killed (the OOM killer), too many bad records: the run's end
                    raise
                except NoBatchLeft:  # the warm-up took the whole epoch: the row is too short (sanity.py)
                    results[id(case)].append(Timing(0.0, 0.0, 0.0, None, 0, True))
                    case.run = None
                except Exception as exc:  # e.g. DALI's plain pipeline stops at a corrupt file: that row only
                    case.run, case.note = None, f"failed: {first_line(exc)}"
                    log.warning("bench: %s %s %s %s", name_of(case.data), case.suite, case.backend, case.note)
                settle()  # work the run left in flight must not slow the next row (settle.py)
                bar.update(1)
    return [case.row(results[id(case)], options) for case in cases]


__all__ = ["run_bench", "BenchOptions", "Case", "Row", "SUITES", "Timing"]
