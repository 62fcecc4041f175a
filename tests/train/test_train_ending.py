"""However a run ends (its last epoch, --max-steps inside an epoch or at its last step, a stop signal,
an error after some steps), it says what it trained in one last line and metrics.jsonl holds a line
with data_wait_pct (#48 row 6: a short run said nothing and wrote no metrics.jsonl; summary.json said
epochs_done 0 though its steps were the whole epoch). Real short runs over the `learnable` fixture."""
import json
import logging
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from datapipe.train import train
from datapipe.train.guard import NonFiniteLoss
from tests.train.conftest import packed_sample
from tests.train.preempting import TINY, SignalAt
from tests.train.support import config, strict_json_lines

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--model", "resnet18", "--image-size", "16", "--batch-size", "8", "--workers", "0", "--backend",
         "dataloader", "--tensorboard", "off"]
LAST = re.compile(r"datapipe train (finished|stopped at --max-steps \d+|stopped by a signal|stopped by an error): "
                  r"(\d+) steps?, (\d+) of \d+ epochs? finished; epoch (\d+)( \(unfinished: \d+ images?\))?: loss "
                  r"(\S+), acc \S+, val_acc \S+, \d+ img/s, data wait [\d.]+% \(dataloader\)$")


@pytest.fixture(scope="module")
def other(tmp_path_factory):
    """A second small labelled dataset (the same 3 classes, 4 train images each) for a mix."""
    return packed_sample(tmp_path_factory, "other", 4)


def last_line(caplog) -> re.Match:
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("datapipe train ")]
    assert len(lines) == 1, lines
    found = LAST.fullmatch(lines[0])
    assert found, lines[0]
    return found


def test_docs_mix_command_with_max_steps_ending_the_epoch_finishes_it(learnable, other, tmp_path):
    """docs/mixing.md's command: --epoch-size 16 at batch 8 is 2 steps, so --max-steps 2 ends the epoch:
    it is evaluated, metrics.jsonl has its line, summary.json counts it, and the last line says so."""
    done = subprocess.run([sys.executable, "-m", "datapipe", "train", learnable, other, "--weights", "0.7,0.3",
                           "--epoch-size", "16", "--max-steps", "2", *SMALL, "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = strict_json_lines(tmp_path / "metrics.jsonl")
    assert (line["epoch"], line["steps"], line["images"]) == (0, 2, 16) and "partial" not in line
    assert 0 <= line["data_wait_pct"] <= 100 and line["val_acc"] is not None
    assert json.loads((tmp_path / "summary.json").read_text())["epochs_done"] == 1
    last = done.stderr.strip().splitlines()[-1].removeprefix("INFO ")
    found = LAST.fullmatch(last)
    assert found and found.group(1, 2, 3, 4, 5) == ("finished", "2", "1", "0", None), last


def test_max_steps_inside_an_epoch_writes_its_line_so_far_which_a_resume_replaces(learnable, tmp_path, caplog):
    """A single dataset, 12 steps an epoch, --max-steps 3: the epoch's line so far ("partial"); the resume
    that finishes the epoch rewrites the file from the checkpoint: one line, the whole epoch's."""
    with caplog.at_level(logging.INFO, logger="datapipe.train"):
        assert train(config(learnable, tmp_path, **TINY, max_steps=3)) == []
    (line,) = strict_json_lines(tmp_path / "metrics.jsonl")
    assert (line["partial"], line["ended"], line["epoch"], line["steps"], line["images"]) == (True, "max_steps", 0, 3, 18)
    assert 0 <= line["data_wait_pct"] <= 100 and line["images_per_s"] > 0 and line["train_loss"] > 0
    assert json.loads((tmp_path / "summary.json").read_text())["epochs_done"] == 0
    found = last_line(caplog)
    assert found.group(1, 2, 3, 4, 5) == ("stopped at --max-steps 3", "3", "0", "0", " (unfinished: 18 images)")
    assert float(found.group(6)) == pytest.approx(line["train_loss"], abs=1e-4)
    metrics = train(config(learnable, tmp_path, **TINY, resume=str(tmp_path / "last.pt")))
    assert strict_json_lines(tmp_path / "metrics.jsonl") == metrics and metrics[0]["images"] == 72


def test_a_stop_signal_writes_the_epochs_line_so_far(learnable, tmp_path, caplog):
    trainer = SignalAt(config(learnable, tmp_path, **TINY), batch=3, signals=(signal.SIGTERM,))
    with caplog.at_level(logging.INFO, logger="datapipe.train"), pytest.raises(Exception, match="preempted by SIGTERM"):
        trainer.fit()
    (line,) = strict_json_lines(tmp_path / "metrics.jsonl")
    assert (line["partial"], line["ended"], line["steps"], line["images"]) == (True, "preempted", 3, 18)
    assert 0 <= line["data_wait_pct"] <= 100
    assert last_line(caplog).group(1, 2) == ("stopped by a signal", "3")


def test_an_error_after_some_steps_writes_the_epochs_line_so_far(learnable, tmp_path, caplog):
    """lr 1e30: the loss goes NaN and the check at step 2 stops the run; its line holds the figures
    (train_loss null: strict JSON has no NaN) and the last line says it stopped by an error."""
    run = config(learnable, tmp_path, **TINY, lr=1e30, warmup_epochs=0, log_every=2)
    with caplog.at_level(logging.INFO, logger="datapipe.train"), pytest.raises(NonFiniteLoss):
        train(run)
    (line,) = strict_json_lines(tmp_path / "metrics.jsonl")
    assert (line["partial"], line["ended"], line["steps"]) == (True, "error", 2) and line["images"] == 12
    assert 0 <= line["data_wait_pct"] <= 100
    assert last_line(caplog).group(1, 2) == ("stopped by an error", "2")


def test_a_whole_run_ends_with_the_line_of_its_last_epoch(learnable, tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="datapipe.train"):
        metrics = train(config(learnable, tmp_path, **{**TINY, "epochs": 2}))
    assert strict_json_lines(tmp_path / "metrics.jsonl") == metrics and len(metrics) == 2
    found = last_line(caplog)
    assert found.group(1, 2, 3, 4, 5) == ("finished", "24", "2", "1", None)
