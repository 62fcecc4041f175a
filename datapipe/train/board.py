"""TensorBoard scalars from `datapipe train`, beside metrics.jsonl (which stays the record): rank 0
only, per log interval (`train/...` at the optimizer step) and per epoch (`epoch/...` at the epoch).
The run's settings and recipe go to the HPARAMS tab (same event file, the epoch scalars as metrics).
TensorBoard is an optional extra (`pip install datapipe[tensorboard]`).

A resume first removes from the folder's event files what the crashed run wrote past the
checkpoint (`train/` after its step, `epoch/` from its epoch on, and the settings, written again),
so each (tag, step) is there once, with the resumed run's value. SummaryWriter's purge_step does
not do it: one step cannot serve the two axes, and TensorBoard's data server ignores it (it drops
a series' later points only when a smaller step of that series comes in)."""
from __future__ import annotations

import logging
import os
import struct
from pathlib import Path
from typing import Any

from ..errors import counted, plain
from ..storage.durable import NotOwnFile, atomic_write, open_own

log = logging.getLogger("datapipe.train")
AUTO, OFF = "auto", "off"
EPOCH_SCALARS = ("train_loss", "train_acc", "val_acc", "ema_val_acc", "images_per_s", "data_wait_pct", "lr",
                 "pool_workers")
HPARAM_METRICS = ("epoch/train_loss", "epoch/train_acc", "epoch/val_acc", "epoch/ema_val_acc")
INTERVAL, EPOCH, HPARAMS = "train/", "epoch/", "_hparams_/"  # tag prefixes
RECORD = struct.Struct("<QI")  # a TFRecord: length, its masked crc32c, the bytes, their masked crc32c


def _writer_class() -> Any:
    """torch's SummaryWriter, or None when the tensorboard package is not installed."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return None
    return SummaryWriter


class Board:
    """One SummaryWriter; scalars are flushed at every epoch's end and on close."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.writer = _writer_class()(log_dir=str(folder))

    @classmethod
    def open(cls, setting: str, out: Path, *, resume_at: tuple[int, int] | None = None) -> "Board | None":
        """`setting`: "auto" (OUT/tensorboard when the package is there), "off", or a folder (the
        package is then required). `resume_at`: the (step, epoch) a resumed run goes on from."""
        if setting == OFF:
            return None
        if _writer_class() is None:
            if setting == AUTO:
                log.info("TensorBoard logs off: the tensorboard package is not installed "
                         "(pip install 'datapipe[tensorboard]'); metrics.jsonl has every figure")
                return None
            raise ValueError(f"--tensorboard {setting}: the tensorboard package is not installed; "
                             "pip install 'datapipe[tensorboard]' (or pass --tensorboard off)")
        folder = out / "tensorboard" if setting == AUTO else Path(setting)
        if resume_at is not None and folder.is_dir():
            drop_past(folder, *resume_at)
        board = cls(folder)
        log.info("TensorBoard logs in %s (tensorboard --logdir %s)", board.folder, board.folder)
        return board

    def hparams(self, settings: dict[str, Any]) -> None:
        """The run's settings (datapipe.train.config.hparams) as the HPARAMS tab's one session; values
        that are not numbers, strings or booleans are written as text, None left out."""
        from torch.utils.tensorboard.summary import hparams

        plain = {k: v if v is None or isinstance(v, (bool, int, float, str)) else str(v) for k, v in settings.items()}
        for summary in hparams(plain, {name: 0.0 for name in HPARAM_METRICS}):
            self.writer.file_writer.add_summary(summary)

    def interval(self, step: int, **scalars: float) -> None:
        for name, value in scalars.items():
            self.writer.add_scalar(INTERVAL + name, value, step)

    def epoch(self, epoch: int, record: dict[str, Any]) -> None:
        for name in EPOCH_SCALARS:
            if record.get(name) is not None:
                self.writer.add_scalar(EPOCH + name, record[name], epoch)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def _event_bytes(file: Path) -> bytes | None:
    """The bytes of an event file; None (and a warning) for a link, FIFO, device or folder named like one,
    which TensorBoard did not write: left as it is, never read (a FIFO blocked, /dev/zero filled memory)."""
    try:
        fd = open_own(file, os.O_RDONLY, what="TensorBoard event file")
    except NotOwnFile:
        log.warning("%s: not a plain file, so not an event file this run wrote: left as it is", plain(str(file)))
        return None
    with os.fdopen(fd, "rb") as fh:
        return fh.read()


def drop_past(folder: Path, step: int, epoch: int) -> None:
    """Remove from the event files in `folder` the crashed run's events past a resume point: `train/`
    scalars after `step`, `epoch/` scalars from `epoch` on, the settings (the resumed run writes them
    again). Each file that changes is rewritten atomically, under the same name (its place in the order)."""
    from google.protobuf.message import DecodeError
    from tensorboard.compat.proto.event_pb2 import Event

    def past(event: Any) -> bool:
        tags = [value.tag for value in event.summary.value]
        return any((tag.startswith(INTERVAL) and event.step > step) or (tag.startswith(EPOCH) and event.step >= epoch)
                   for tag in tags)

    def settings(event: Any) -> bool:
        return any(value.tag.startswith(HPARAMS) for value in event.summary.value)

    for file in sorted(folder.glob("*tfevents*")):
        data = _event_bytes(file)
        if data is None:
            continue
        kept, at, dropped, settings_dropped = [], 0, 0, 0
        while at + RECORD.size <= len(data):
            length = RECORD.unpack_from(data, at)[0]
            end = at + RECORD.size + length + 4
            if end > len(data):
                break  # a record cut short by the crash: kept as it is, every reader skips it
            try:
                event = Event.FromString(data[at + RECORD.size:end - 4])
            except DecodeError:  # not an event: the rest of the file is kept untouched
                break
            if past(event):
                dropped += 1
            elif settings(event):
                settings_dropped += 1
            else:
                kept.append(data[at:end])
            at = end
        if dropped or settings_dropped:
            with atomic_write(file, needs=len(data), tmp_stem=".datapipe-rewrite") as fh:
                fh.write(b"".join(kept) + data[at:])
        if dropped:  # the settings are written again by every run: only events past the resume point are news
            log.info("%s: %s past the resumed step %d / epoch %d removed", file.name, counted(dropped, "event"), step,
                     epoch)
