"""What the trainer scripts' ranks wrote they were served, and the checks every trainer test makes."""
from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

from tests.processes import run_in_session

STEPS_PER_EPOCH = 4  # the packed fixture's 27 records over 2 ranks at batch 4: 14 each, 4 batches
MID_STEP = 6  # epoch 1 after 2 of its 4 batches


def run_to_end(argv: list[str], timeout: int) -> str:
    """Run a command that starts ranks; its stdout (a hang kills them all and fails)."""
    return run_in_session(argv, timeout).stdout


def run_script(script: Path, data, out, *args: str, timeout: int = 300) -> dict[int, list[dict]]:
    """Run a trainer script on 2 ranks; per rank, the records it wrote (steps served, epoch starts)."""
    run_to_end([sys.executable, str(script), str(data), str(out), *args], timeout)
    return read_ranks(out, 2)


def read_ranks(out, world: int) -> dict[int, list[dict]]:
    """Per rank of `world`, the records its script wrote to OUT/served-rank{r}.jsonl."""
    return {rank: [json.loads(line) for line in (Path(out) / f"served-rank{rank}.jsonl").read_text().splitlines()]
            for rank in range(world)}


def steps(records: list[dict]) -> list[dict]:
    return [r for r in records if "indices" in r]


def per_epoch(records: list[dict]) -> dict[int, list[int]]:
    epochs = defaultdict(list)
    for r in steps(records):
        epochs[r["epoch"]] += r["indices"]
    return dict(epochs)


def check_epochs(ranks: dict[int, list[dict]], size: int, epochs: int) -> None:
    """Every epoch: the ranks together read every record (one padded repeat: 27 over 2 ranks), and
    each epoch is a new order on every rank; every epoch start saw len(loader) batches at world size 2."""
    orders = {rank: per_epoch(records) for rank, records in ranks.items()}
    for epoch in range(epochs):
        both = orders[0][epoch] + orders[1][epoch]
        assert sorted(set(both)) == list(range(size)) and len(both) == size + 1, epoch
        if epoch:
            assert all(orders[r][epoch] != orders[r][epoch - 1] for r in ranks), f"epoch {epoch} repeats"
    starts = [r for records in ranks.values() for r in records if "epoch_start" in r]
    assert starts and all(s["len"] == STEPS_PER_EPOCH and s["world"] == 2 for s in starts)


def served_after(records: list[dict], step: int) -> list[tuple]:
    """(epoch, step, indices, pixel sum) of the training steps at or after global step `step`."""
    return [(r["epoch"], r["step"], r["indices"], round(r["pixels"], 2)) for r in steps(records) if r["step"] >= step]
