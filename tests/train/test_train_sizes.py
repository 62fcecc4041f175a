"""`datapipe train`'s image sizes: a preset's own (ffcv-rn50's 160 -> 192 ramp, rsb-a3's 160 train / 224
eval), --image-size MIN:MAX (FFCV's ramp), --image-size-schedule FILE, --eval-size (FixRes), a resume
that keeps the sizes, and the one-line refusals."""
import json
import re

import pytest

from datapipe.augment import PRESETS
from datapipe.augment.recipe import PRESET_SIZES
from datapipe.augment.resolution import ffcv_ramp
from datapipe.cli.main import main
from datapipe.train import Trainer, TrainConfig
from datapipe.train.checkpoint import load
from tests.train.conftest import packed_sample
from tests.train.support import config, strict_json_lines

TINY = ["--model", "resnet18", "--batch-size", "3", "--workers", "1", "--backend", "dataloader"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """3 classes: 6 train images (2 steps of 3 an epoch), 3 val images."""
    return packed_sample(tmp_path_factory, "tiny", 2)


def sizes_served(out):
    return [(m["epoch"], m["image_size"], m["eval_size"]) for m in strict_json_lines(out / "metrics.jsonl")]


def test_ffcv_rn50_ramps_its_train_size_and_evaluates_at_256(tiny, tmp_path):
    """The preset's own sizes, no --image-size: 160 then 192 (FFCV's ramp over 2 epochs), val at 256."""
    assert main(["train", tiny, *TINY, "--recipe", "ffcv-rn50", "--epochs", "2", "--out", str(tmp_path)]) == 0
    assert sizes_served(tmp_path) == [(0, 160, 256), (1, 192, 256)]
    assert load(tmp_path / "last.pt")["config"]["image_size"] == {0: 160, 1: 192}


def test_ffcvs_own_rn50_configs_follow_the_ramp_rule():
    """start_ramp, end_ramp of ffcv-imagenet's rn50_{16,24,32,40,56,88}_epochs.yaml."""
    ffcv = {16: (11, 13), 24: (17, 20), 32: (23, 27), 40: (29, 34), 56: (41, 48), 88: (65, 76)}
    for epochs, (start, end) in ffcv.items():
        ramp = ffcv_ramp(160, 192, epochs)
        assert (ramp.start_epoch, ramp.end_epoch) == (start, end)
    assert TrainConfig(data="d", out="o", recipe="ffcv-rn50", epochs=16).image_size == {0: 160, 12: 192}


@pytest.mark.parametrize("recipe,train,eval_size", [
    ("default", 224, 224), ("deit", 224, 224), ("rsb-a3", 160, 224), ("tv-v2", 176, 224),
    ("ffcv-rn50", {0: 160, 3: 192}, 256)])
def test_every_preset_carries_its_train_and_eval_sizes(recipe, train, eval_size):
    assert set(PRESET_SIZES) == set(PRESETS)
    found = TrainConfig(data="d", out="o", recipe=recipe, epochs=4)
    assert (found.image_size, found.eval_size) == (train, eval_size)
    assert TrainConfig(data="d", out="o", recipe=recipe, image_size=32).eval_size == 32  # a size given: eval follows


def test_the_loaders_serve_a_presets_sizes_and_eval_size(tiny, tmp_path):
    """rsb-a3: train batches at 160, val batches at 224 (FixRes); --eval-size makes val batches larger."""
    trainer = Trainer(config(tiny, tmp_path / "a", recipe="rsb-a3", image_size=None, batch_size=3, epochs=1))
    assert next(iter(trainer.loader)).images.shape[-2:] == (160, 160)
    assert next(iter(trainer.val_loader)).images.shape[-2:] == (224, 224)
    trainer = Trainer(config(tiny, tmp_path / "b", image_size="16:32", eval_size=48, batch_size=3, epochs=4))
    shapes = []
    for epoch in range(4):
        trainer.loader.set_epoch(epoch)
        shapes.append(next(iter(trainer.loader)).images.shape[-1])
    assert shapes == [16, 16, 16, 32]
    assert next(iter(trainer.val_loader)).images.shape[-1] == 48


def test_a_schedule_file_and_a_resume_that_keeps_its_sizes(tiny, tmp_path):
    """The sizes are recorded as {epoch: size}: a resume with more --epochs serves them, not a new ramp."""
    schedule = tmp_path / "sizes.json"
    schedule.write_text(json.dumps({"0": 16, "1": 32}))
    out = tmp_path / "run"
    assert main(["train", tiny, *TINY, "--epochs", "2", "--image-size-schedule", str(schedule), "--eval-size", "40",
                 "--out", str(out)]) == 0
    assert sizes_served(out) == [(0, 16, 40), (1, 32, 40)]
    assert main(["train", tiny, "--epochs", "3", "--out", str(out), "--resume", str(out / "last.pt")]) == 0
    assert sizes_served(out)[2] == (2, 32, 40)
    out = tmp_path / "ramp"
    assert main(["train", tiny, *TINY, "--epochs", "2", "--image-size", "16:32", "--max-steps", "1",
                 "--out", str(out)]) == 0
    assert load(out / "last.pt")["config"]["image_size"] == {0: 16, 1: 32}
    assert main(["train", tiny, "--epochs", "4", "--out", str(out), "--resume", str(out / "last.pt")]) == 0
    assert [size for _, size, _ in sizes_served(out)] == [16, 32, 32, 32]  # 16:32 over 4 epochs: 16, 16, 16, 32


@pytest.mark.parametrize("flags,message", [
    (["--image-size", "192:160"], r"image_size 192:160 would shrink the images over the run: give MIN:MAX with "
                                  r"MIN <= MAX \(e.g. 160:192\)"),
    (["--image-size", "160-192"], r"image_size '160-192' is neither a size nor MIN:MAX: give e.g. 224, or 160:192"),
    (["--image-size", "4:192"], r"image_size must be within 8..8192 \(an int, pixels a side.*got 4"),
    (["--eval-size", "100000"], r"eval_size must be within 8..8192 \(an int, pixels a side.*got 100000"),
    (["--image-size", "32", "--image-size-schedule", "SCHEDULE"], r"--image-size and --image-size-schedule both"),
    (["--image-size-schedule", "MISSING"], r"--image-size-schedule .*missing.json: cannot read it as JSON "
                                           r"\(No such file or directory\)"),
    (["--image-size-schedule", "SCHEDULE"], r"image_size: the schedule \{'1': 32\} does not give epoch 0's size"),
])
def test_bad_sizes_are_one_line_and_exit_2(tiny, tmp_path, capsys, flags, message):
    schedule = tmp_path / "sizes.json"
    schedule.write_text(json.dumps({"1": 32}))
    flags = [str(schedule) if f == "SCHEDULE" else str(tmp_path / "missing.json") if f == "MISSING" else f
             for f in flags]
    assert main(["train", tiny, *TINY, "--out", str(tmp_path / "run"), *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("datapipe train: error: ")
    assert re.search(message, err), err
    assert not (tmp_path / "run" / "last.pt").exists()


@pytest.mark.parametrize("value,message", [
    ({"0": 16, "x": 32}, r"image_size: the schedule's epoch 'x' is not an epoch number"),
    ([16, 16.5], r"image_size of epoch 1 must be within 8..8192 \(an int"),
    (True, r"image_size must be within 8..8192 \(an int.*got True"),
])
def test_train_config_refuses_a_bad_schedule(value, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(data="d", out="o", image_size=value)
