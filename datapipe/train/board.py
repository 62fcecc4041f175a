"""TensorBoard scalars from `datapipe train`, beside metrics.jsonl (which stays the record): rank 0
only, per log interval (`train/...` at the optimizer step) and per epoch (`epoch/...` at the epoch).
The run's settings and recipe go to the HPARAMS tab (same event file, the epoch scalars as metrics).
TensorBoard is an optional extra (`pip install datapipe[tensorboard]`)."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

log = logging.getLogger("datapipe.train")
AUTO, OFF = "auto", "off"
EPOCH_SCALARS = ("train_loss", "train_acc", "val_acc", "ema_val_acc", "images_per_s", "data_wait_pct", "lr")
HPARAM_METRICS = ("epoch/train_loss", "epoch/train_acc", "epoch/val_acc", "epoch/ema_val_acc")


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
    def open(cls, setting: str, out: Path) -> "Board | None":
        """`setting`: "auto" (OUT/tensorboard when the package is there), "off", or a folder (the
        package is then required)."""
        if setting == OFF:
            return None
        if _writer_class() is None:
            if setting == AUTO:
                log.info("TensorBoard logs off: the tensorboard package is not installed "
                         "(pip install 'datapipe[tensorboard]'); metrics.jsonl has every figure")
                return None
            raise ValueError(f"--tensorboard {setting}: the tensorboard package is not installed; "
                             "pip install 'datapipe[tensorboard]' (or pass --tensorboard off)")
        board = cls(out / "tensorboard" if setting == AUTO else Path(setting))
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
            self.writer.add_scalar(f"train/{name}", value, step)

    def epoch(self, epoch: int, record: dict[str, Any]) -> None:
        for name in EPOCH_SCALARS:
            if record.get(name) is not None:
                self.writer.add_scalar(f"epoch/{name}", record[name], epoch)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
