"""The `datapipe bench` commands `datapipe doctor DATA` prints, fitted to DATA's length so each runs as
printed: bench times a figure only over a long enough window (bench/sanity.py) and exits 2 where no row
has one, so on a short dataset the command takes a smaller --batch-size, or, where even batch 1 is too
long, gives way to a line saying how many records bench needs."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch

from ..bench.advice import default_workers
from ..bench.sanity import records_needed
from ..bench.suites import BenchOptions
from ..bench.window import DRAIN_BATCHES
from ..formats import read_manifest
from ..formats.scan import scan_folder
from ..storage import is_url

DEFAULTS = BenchOptions()
# The most loader workers a suite runs at bench's defaults (suites.py: pipeline at the default W, the
# loader suite at W/2, W and 2W); read and decode rows have no workers (one batch after the warm-up).
LOADER_WORKERS = {"pipeline": 1, "baseline": 1, "loader": 2}


def train_records(data: str) -> int | None:
    """The records of DATA's train split that bench reads (its default --split), from a packed dataset's
    manifest or an image folder's scan; None where that is not known without reading the data (a URL, shards
    or Parquet files of other tools, a damaged manifest): bench then says itself what it needs."""
    if is_url(data):
        return None
    try:
        manifest = read_manifest(Path(data))
        if manifest is not None:
            return manifest.splits[DEFAULTS.split].samples if DEFAULTS.split in manifest.splits else None
        return len(scan_folder(data).splits.get(DEFAULTS.split, [])) if Path(data).is_dir() else None
    except (ValueError, OSError):
        return None


def batches_needed(suites: str, device: torch.device) -> int:
    """Batches an epoch of DATA needs for every row of `--suites SUITES` to time a figure at bench's defaults."""
    workers = max(LOADER_WORKERS.get(s, 0) for s in suites.split(",")) * default_workers(device)
    if workers:
        return records_needed(workers, replace(DEFAULTS, batch_size=1))
    return DEFAULTS.warmup + DRAIN_BATCHES + 1


def fitted(hint: str, suites: str, records: int | None, device: torch.device) -> str:
    """`hint`, whose command ends it (bench/advice.py's "measure it: datapipe bench ..."), for a dataset of
    `records` records: as it is, with a --batch-size that fits, or a line saying what bench needs instead."""
    needed = batches_needed(suites, device)
    if records is None or records >= needed * DEFAULTS.batch_size:
        return hint
    batch = records // needed
    if batch < 1:
        return (f"too few records to measure it here: bench's window needs {needed:,} batches of the train split "
                f"(this machine's {default_workers(device)} workers), the data holds {records:,} records")
    return (f"{records:,} train records, under the {needed * DEFAULTS.batch_size:,} bench times at batch "
            f"{DEFAULTS.batch_size}: {hint} --batch-size {batch}")
