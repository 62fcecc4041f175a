"""metrics.jsonl and TensorBoard after a crash and a resume: one line per epoch, each (tag, step) once
with the resumed run's value, whichever write the crash fell between. The on-disk state a crash
leaves is built for real: a run goes an epoch further than the last.pt put back in its --out."""
import json
import shutil

import pytest

from datapipe.train import train
from tests.train.support import config, strict_json_lines

pytest.importorskip("tensorboard", reason="the tensorboard extra is part of the dev install")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

INTERVAL = ("loss", "accuracy", "lr", "images_per_s", "data_wait_pct")
EPOCH = ("train_loss", "train_acc", "val_acc", "images_per_s", "data_wait_pct", "lr")


def run_config(data, out, **kw):
    """Batch 36: two steps an epoch, each logged; TensorBoard in OUT/tb; no worker processes to start."""
    return config(data, out, batch_size=36, log_every=1, workers=0, tensorboard=str(out / "tb"), **kw)


def points(folder) -> dict[str, list[tuple[int, float]]]:
    """Every scalar point TensorBoard's own reader keeps, duplicates included, in order."""
    events = EventAccumulator(str(folder))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


@pytest.fixture(scope="module")
def two_epochs(learnable, tmp_path_factory):
    """A run of two epochs (steps 1-4) whose --out also keeps the last.pt of its first epoch."""
    out = tmp_path_factory.mktemp("two-epochs")
    train(run_config(learnable, out, epochs=1))
    shutil.copy(out / "last.pt", out / "epoch1.pt")
    train(run_config(learnable, out, epochs=2, resume=str(out / "last.pt")))
    return out


def test_a_crash_before_the_epochs_checkpoint_leaves_one_line_and_one_point_per_step(learnable, two_epochs, tmp_path):
    """What a kill -9 between epoch 1's metrics and board writes and its checkpoint leaves: the
    epoch-1 checkpoint, with metrics.jsonl, and the board's steps 3-4 and epoch 1, a step ahead."""
    run = shutil.copytree(two_epochs, tmp_path / "run")
    shutil.copy(run / "epoch1.pt", run / "last.pt")
    crashed = points(run / "tb")
    assert [step for step, _ in crashed["train/loss"]] == [1, 2, 3, 4] and len(crashed["epoch/lr"]) == 2
    metrics = train(run_config(learnable, run, epochs=2, resume=str(run / "last.pt")))
    assert [m["epoch"] for m in metrics] == [0, 1]
    assert strict_json_lines(run / "metrics.jsonl") == metrics
    found = points(run / "tb")
    for name in INTERVAL:
        assert [step for step, _ in found[f"train/{name}"]] == [1, 2, 3, 4], name
    for name in EPOCH:
        assert [step for step, _ in found[f"epoch/{name}"]] == [0, 1], name
        assert [v for _, v in found[f"epoch/{name}"]] == pytest.approx([m[name] for m in metrics], rel=1e-5), name


def test_resume_rewrites_metrics_jsonl_from_the_checkpoint(learnable, two_epochs, tmp_path):
    """A crash after epoch 1's checkpoint but before its line: the line comes back; a line past the
    checkpoint (an older metrics writer's) goes. Nothing is left to train."""
    run = shutil.copytree(two_epochs, tmp_path / "run")
    whole = strict_json_lines(run / "metrics.jsonl")
    assert [m["epoch"] for m in whole] == [0, 1]
    (run / "metrics.jsonl").write_text(json.dumps(whole[0]) + "\n")
    assert train(run_config(learnable, run, epochs=2, resume=str(run / "last.pt"))) == whole
    assert strict_json_lines(run / "metrics.jsonl") == whole
    (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in [*whole, {**whole[1], "epoch": 2}]))
    train(run_config(learnable, run, epochs=2, resume=str(run / "last.pt")))
    assert strict_json_lines(run / "metrics.jsonl") == whole
