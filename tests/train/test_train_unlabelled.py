"""`datapipe train` over data without labels (#47 row 7): it stopped at step 1 with a raw "IndexError:
Target -1 is out of bounds". Now a dataset without labels is refused in one line before training
starts, so is a mix source without labels unless its weight is 0, and records without a label inside
a labelled dataset are refused at the first read of the device, in one line."""
import subprocess
import sys
from pathlib import Path

import pytest

from datapipe.train import train
from tests.conftest import BAD_FILES, IMAGEFOLDER
from tests.train.support import config
from tools.make_img2dataset_sample import make

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--model", "resnet18", "--image-size", "16", "--batch-size", "4", "--workers", "0", "--backend",
         "dataloader", "--tensorboard", "off", "--max-steps", "1"]


@pytest.fixture(scope="module")
def captions(tmp_path_factory) -> str:
    """img2dataset's layout: image-text shards, no .cls (every record's label -1, no class names)."""
    root = tmp_path_factory.mktemp("captions") / "data"
    make(root, shards=2, per_shard=6, failed=0, seed=1)
    return str(root)


@pytest.fixture(scope="module")
def some_unlabelled(tmp_path_factory) -> str:
    """webdataset shards of the fixture's images where every third sample has no .cls (label -1)."""
    import webdataset as wds

    from datapipe.formats.scan import scan_folder

    root = tmp_path_factory.mktemp("some-unlabelled")
    files = [f for f in scan_folder(IMAGEFOLDER).splits["train"] if f.relpath not in BAD_FILES
             and f.path.read_bytes()[:3] == b"\xff\xd8\xff"]
    with wds.TarWriter(str(root / "part-000000.tar")) as sink:
        for i, f in enumerate(files):
            sample = {"__key__": f.key, "jpg": f.path.read_bytes()}
            if i % 3:
                sample["cls"] = str(f.label)
            sink.write(sample)
    return str(root / "part-000000.tar")


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "datapipe", "train", *args, *SMALL], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)


def one_line_error(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if not line.startswith("INFO ")]
    assert len(lines) == 1, done.stderr
    return lines[0]


def test_a_dataset_without_labels_is_refused_before_training(captions, tmp_path):
    line = one_line_error(cli(captions, "--out", str(tmp_path)))
    assert line.startswith(f"datapipe train: error: {captions} has no labels") and "trains a classifier" in line
    assert not (tmp_path / "last.pt").exists()


def test_a_mix_source_without_labels_is_refused_by_name_unless_its_weight_is_0(learnable, captions, tmp_path):
    line = one_line_error(cli(learnable, f"web={captions}", "--weights", "0.7,0.3", "--out", str(tmp_path / "a")))
    assert f"mix source web ({captions}) has no labels" in line and "weight 0" in line
    done = cli(learnable, f"web={captions}", "--weights", "1,0", "--out", str(tmp_path / "b"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "b" / "metrics.jsonl").exists()


def test_records_without_a_label_in_a_labelled_dataset_are_refused_at_the_first_read(some_unlabelled, tmp_path):
    """Batch 4 over samples whose every third has no .cls: the first step meets one; log_every 1 reads
    the device after it. (The loss ignored it: no IndexError on the way.)"""
    run = config(some_unlabelled, tmp_path, epochs=1, batch_size=4, image_size=16, log_every=1, workers=0)
    with pytest.raises(ValueError, match=r"^\d+ train samples? without a label \(-1, or mixed with one\) in epoch 0 "
                                         r"by step \d+ .*every record needs a label"):
        train(run)


@pytest.mark.parametrize("recipe", ["deit", "tv-v2"])
def test_records_without_a_label_under_soft_targets_are_refused_too(some_unlabelled, tmp_path, recipe):
    """Mixup/cutmix and smoothing turn labels into soft rows: a -1 record's row was counted as labelled,
    and the run trained on without a word (the batch stage gives it zeros; the adversarial pass found it)."""
    run = config(some_unlabelled, tmp_path, epochs=1, batch_size=4, image_size=16, log_every=1, workers=0,
                 recipe=recipe)
    with pytest.raises(ValueError, match=r"without a label \(-1, or mixed with one\)"):
        train(run)
