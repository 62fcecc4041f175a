"""PyTorch Lightning with the real library (2 CPU ranks, gloo): a user returns make_loader(...) from
train_dataloader() and nothing else, under strategy="ddp" and "ddp_spawn"."""
from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from datapipe import open_dataset

pytest.importorskip("pytorch_lightning")
SCRIPT = Path(__file__).with_name("lightning_run.py")
STEPS_PER_EPOCH = 4  # 27 records over 2 ranks at batch 4: 14 each, 4 batches
MID_STEP = 6  # epoch 1 after 2 of its 4 batches


def lightning(data, out, *args: str) -> dict[int, list[dict]]:
    """Run the script; per rank, the records it wrote (what it was served, epoch starts)."""
    done = subprocess.run([sys.executable, str(SCRIPT), str(data), str(out), *args], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return {rank: [json.loads(line) for line in (Path(out) / f"served-rank{rank}.jsonl").read_text().splitlines()]
            for rank in (0, 1)}


def steps(records: list[dict]) -> list[dict]:
    return [r for r in records if "indices" in r]


def per_epoch(records: list[dict]) -> dict[int, list[int]]:
    epochs = defaultdict(list)
    for r in steps(records):
        epochs[r["epoch"]] += r["indices"]
    return dict(epochs)


def check_epochs(ranks: dict[int, list[dict]], size: int, epochs: int) -> None:
    """Every epoch: the ranks together read every record (one padded repeat), each epoch a new order;
    Lightning's progress total is len(loader)."""
    orders = {rank: per_epoch(records) for rank, records in ranks.items()}
    for epoch in range(epochs):
        both = orders[0][epoch] + orders[1][epoch]
        assert sorted(set(both)) == list(range(size)) and len(both) == size + 1, epoch
        if epoch:
            assert all(orders[r][epoch] != orders[r][epoch - 1] for r in ranks), f"epoch {epoch} repeats"
    starts = [r for records in ranks.values() for r in records if "epoch_start" in r]
    assert starts and all(s["total"] == s["len"] == STEPS_PER_EPOCH and s["world"] == 2 for s in starts)


def served_after(records: list[dict], step: int) -> list[tuple]:
    """(epoch, step, indices, pixel sum) of the training steps at or after global step `step`."""
    return [(r["epoch"], r["step"], r["indices"], round(r["pixels"], 2)) for r in steps(records) if r["step"] >= step]


@pytest.fixture(scope="module")
def uninterrupted(packed_wds, tmp_path_factory):
    out = tmp_path_factory.mktemp("lightning") / "whole"
    return out, lightning(packed_wds, out, "--strategy", "ddp", "--save-step", str(MID_STEP), "--save-epoch", "0")


def test_ddp_every_epoch_complete_disjoint_and_new(packed_wds, uninterrupted):
    _, ranks = uninterrupted
    check_epochs(ranks, len(open_dataset(packed_wds)), 3)


@pytest.mark.parametrize("checkpoint, first_step", [("mid.ckpt", MID_STEP), ("epoch-end.ckpt", STEPS_PER_EPOCH)])
def test_ddp_resume_serves_exactly_what_the_uninterrupted_run_served(packed_wds, uninterrupted, tmp_path,
                                                                     checkpoint, first_step):
    """Trainer.fit(ckpt_path=...) from a mid-epoch and an epoch-end checkpoint: the same batches, crops
    included, as the run that went on; nothing served twice."""
    whole, ranks = uninterrupted
    resumed = lightning(packed_wds, tmp_path, "--strategy", "ddp", "--resume", str(whole / checkpoint))
    for rank in (0, 1):
        assert served_after(resumed[rank], 0) == served_after(ranks[rank], first_step)


def test_ddp_spawn_serves_the_same_and_resumes_mid_epoch(packed_wds, uninterrupted, tmp_path):
    whole_ddp = uninterrupted[1]
    spawned = lightning(packed_wds, tmp_path / "whole", "--strategy", "ddp_spawn", "--save-step", str(MID_STEP))
    check_epochs(spawned, len(open_dataset(packed_wds)), 3)
    for rank in (0, 1):
        assert served_after(spawned[rank], 0) == served_after(whole_ddp[rank], 0)
    resumed = lightning(packed_wds, tmp_path / "resumed", "--strategy", "ddp_spawn",
                        "--resume", str(tmp_path / "whole" / "mid.ckpt"))
    for rank in (0, 1):
        assert served_after(resumed[rank], 0) == served_after(whole_ddp[rank], MID_STEP)
