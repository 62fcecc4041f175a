"""A Lightning run as a user writes it: train_dataloader() returns datapipe.make_loader(...), nothing
else. Each rank writes what it was served (epoch, step, record indices) to OUT/served-rank{r}.jsonl;
checkpoints are saved mid-epoch and at an epoch's end through Trainer.save_checkpoint.

python lightning_run.py DATA OUT --strategy ddp|ddp_spawn|auto [--devices N] [--resume CKPT] [--save-step N]
    [--save-epoch E] [--max-steps N] [--workers N] [--backend NAME] [--start-method fork|spawn|forkserver]
DATA: a dataset, or mix:NAME=PATH,... (tests/trainers/mixed.py: each batch's sources, labels and per-sample
pixel sums are written too). main(argv) runs it in the calling process (--strategy auto --devices 1).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytorch_lightning as pl
import torch

import datapipe

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.trainers.mixed import FIELDS, batch_log, data_of  # noqa: E402


class Recorder(pl.LightningModule):
    def __init__(self, data: str, out: str, workers: int, backend: str, start_method: str | None) -> None:
        super().__init__()
        self.data, self.out, self.workers, self.backend = data, Path(out), workers, backend
        self.start_method = start_method
        self.head = torch.nn.Linear(3, 3)

    def train_dataloader(self):
        data = data_of(self.data)
        fields = FIELDS if isinstance(data, datapipe.Mix) else ("image", "label")
        return datapipe.make_loader(data, split="train", batch_size=4, train=True, image_size=16, fields=fields,
                                    num_workers=self.workers, backend=self.backend, start_method=self.start_method)

    def training_step(self, batch, batch_idx):
        images, labels, indices = batch.images, batch.labels, batch.indices
        loader = self.trainer.train_dataloader
        self.write({"epoch": self.current_epoch, "step": self.global_step, "indices": indices.tolist(),
                    "pixels": float(images.sum()), **(batch_log(batch, loader) if loader.mix else {})})
        return torch.nn.functional.cross_entropy(self.head(images.mean(dim=(2, 3))), labels)

    def on_train_epoch_start(self) -> None:
        loader = self.trainer.train_dataloader
        self.write({"epoch_start": self.current_epoch, "total": self.trainer.num_training_batches,
                    "len": len(loader), "world": self.trainer.world_size})

    def write(self, record: dict) -> None:
        with open(self.out / f"served-rank{self.global_rank}.jsonl", "a") as fh:
            fh.write(json.dumps(record) + "\n")

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class SaveAt(pl.Callback):
    """Checkpoints at a global step (mid-epoch) and at an epoch's end, as ModelCheckpoint would."""

    def __init__(self, out: Path, step: int | None, epoch: int | None) -> None:
        self.out, self.step, self.epoch = out, step, epoch

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            trainer.save_checkpoint(self.out / "mid.ckpt")

    def on_train_epoch_end(self, trainer, module) -> None:
        if trainer.current_epoch == self.epoch:
            trainer.save_checkpoint(self.out / "epoch-end.ckpt")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("data")
    parser.add_argument("out")
    parser.add_argument("--strategy", default="ddp")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--max-steps", type=int, default=-1)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--backend", default="dataloader")
    parser.add_argument("--start-method", help="how the loader starts its workers (default: the process's own)")
    parser.add_argument("--resume")
    parser.add_argument("--save-step", type=int)
    parser.add_argument("--save-epoch", type=int)
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    trainer = pl.Trainer(accelerator="cpu", devices=args.devices, strategy=args.strategy, max_epochs=args.epochs,
                         max_steps=args.max_steps,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0,
                         callbacks=[SaveAt(out, args.save_step, args.save_epoch)])
    module = Recorder(args.data, str(out), args.workers, args.backend, args.start_method)
    trainer.fit(module, ckpt_path=args.resume)


if __name__ == "__main__":
    main()
