"""TensorBoard from `datapipe train`: rank 0's scalars per log interval and per epoch, read back with
TensorBoard's own event reader; metrics.jsonl stays and agrees."""
import json

import pytest

from datapipe.train import train
from tests.train.support import config

pytest.importorskip("tensorboard", reason="the tensorboard extra is part of the dev install")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

INTERVAL = ("loss", "accuracy", "lr", "images_per_s", "data_wait_pct")
EPOCH = ("train_loss", "train_acc", "val_acc", "images_per_s", "data_wait_pct", "lr")


def scalars(folder) -> dict[str, list[tuple[int, float]]]:
    events = EventAccumulator(str(folder))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_train_writes_interval_and_epoch_scalars_that_match_metrics_jsonl(learnable, tmp_path):
    metrics = train(config(learnable, tmp_path, epochs=2, log_every=2, tensorboard=str(tmp_path / "tb")))
    found = scalars(tmp_path / "tb")
    assert set(found) == {f"train/{n}" for n in INTERVAL} | {f"epoch/{n}" for n in EPOCH}
    for name in INTERVAL:  # 6 steps an epoch, a log line every 2
        assert [step for step, _ in found[f"train/{name}"]] == [2, 4, 6, 8, 10, 12], name
    for name in EPOCH:
        assert [step for step, _ in found[f"epoch/{name}"]] == [0, 1], name
        assert [v for _, v in found[f"epoch/{name}"]] == pytest.approx([m[name] for m in metrics], rel=1e-5), name
    assert all(0 <= v <= 1 for _, v in found["train/accuracy"] + found["epoch/train_acc"])
    assert all(0 <= v <= 100 for _, v in found["train/data_wait_pct"])
    assert [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == metrics


def test_by_default_the_scalars_go_under_the_run_folder_and_off_writes_none(learnable, tmp_path):
    train(config(learnable, tmp_path / "default", epochs=1))
    assert list((tmp_path / "default" / "tensorboard").glob("events.out.tfevents.*"))
    train(config(learnable, tmp_path / "off", epochs=1, tensorboard="off"))
    assert not (tmp_path / "off" / "tensorboard").exists()


def test_asking_for_tensorboard_without_the_package_is_one_line(learnable, tmp_path):
    from tests.converters.faults import run_datapipe

    hide = "import sys; sys.modules['tensorboard'] = None  # as if not installed"
    done = run_datapipe(["train", learnable, "--model", "resnet18", "--epochs", "1", "--batch-size", "12",
                         "--image-size", "32", "--workers", "0", "--out", str(tmp_path / "run"),
                         "--tensorboard", str(tmp_path / "tb")], prelude=hide)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"datapipe train: error: --tensorboard {tmp_path / 'tb'}: the tensorboard package is not installed; pip install "
        "'datapipe[tensorboard]' (or pass --tensorboard off)")
