"""A resume's TensorBoard clean-up says what it removed: the settings (HPARAMS), which every run writes
again, are replaced without a line claiming events past the checkpoint (a clean run resumed for one
more epoch said "3 events past the resumed step 3 / epoch 1 removed": those were its settings). A
FIFO, folder or link named like an event file is left alone (a FIFO hung the resume, a folder was an
IsADirectoryError traceback, a link to /dev/zero filled memory: tools/adversarial/cases/docwalk2.py)."""
import logging
import os

import pytest

from datapipe.train.board import drop_past
from tests.processes import deadline

pytest.importorskip("tensorboard", reason="the tensorboard extra is part of the dev install")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402
from torch.utils.tensorboard import SummaryWriter  # noqa: E402
from torch.utils.tensorboard.summary import hparams  # noqa: E402


def write_run(folder, *, train_steps: list[int], epochs: list[int]) -> None:
    writer = SummaryWriter(log_dir=str(folder))
    for summary in hparams({"lr": 0.1}, {"epoch/val_acc": 0.0}):
        writer.file_writer.add_summary(summary)
    for step in train_steps:
        writer.add_scalar("train/loss", 1.0, step)
    for epoch in epochs:
        writer.add_scalar("epoch/val_acc", 0.5, epoch)
    writer.close()


def tags(folder) -> dict[str, list[int]]:
    events = EventAccumulator(str(folder))
    events.Reload()
    return {tag: [e.step for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_a_finished_run_resumed_removes_its_settings_without_claiming_events_past(tmp_path, caplog):
    write_run(tmp_path, train_steps=[2], epochs=[0])  # epoch 0 finished at step 3: nothing past it
    with caplog.at_level(logging.INFO, logger="datapipe.train"):
        drop_past(tmp_path, 3, 1)
    assert "removed" not in caplog.text
    assert tags(tmp_path) == {"train/loss": [2], "epoch/val_acc": [0]}
    assert "_hparams_/experiment" not in EventAccumulator(str(tmp_path)).Reload().summary_metadata


def test_events_past_the_resume_point_are_counted_alone(tmp_path, caplog):
    write_run(tmp_path, train_steps=[2, 4, 6], epochs=[0, 1])  # crashed in epoch 2 at step 6, resumed at 3 / 1
    with caplog.at_level(logging.INFO, logger="datapipe.train"):
        drop_past(tmp_path, 3, 1)
    assert "3 events past the resumed step 3 / epoch 1 removed" in caplog.text  # 4, 6 and epoch 1; not the 3 settings
    assert tags(tmp_path) == {"train/loss": [2], "epoch/val_acc": [0]}


@pytest.mark.parametrize("kind", ["fifo", "folder", "link"])
def test_what_is_not_a_plain_event_file_is_left_alone(tmp_path, caplog, kind):
    write_run(tmp_path, train_steps=[2, 4], epochs=[0])
    odd = tmp_path / "events.out.tfevents.0.odd.0.0"  # sorted first: read before the real file
    (tmp_path / "target").write_bytes(b"x" * 64)  # a link to /dev/zero filled memory: the test links a file
    {"fifo": os.mkfifo, "folder": os.mkdir, "link": lambda p: p.symlink_to(tmp_path / "target")}[kind](odd)
    with caplog.at_level(logging.INFO, logger="datapipe.train"), deadline(20):
        drop_past(tmp_path, 3, 1)
    assert "not a plain file, so not an event file this run wrote: left as it is" in caplog.text
    assert "1 event past the resumed step 3 / epoch 1 removed" in caplog.text
    assert os.path.lexists(odd)
    (os.rmdir if kind == "folder" else os.remove)(odd)  # TensorBoard's own reader would hang on it too
    assert tags(tmp_path) == {"train/loss": [2], "epoch/val_acc": [0]}
