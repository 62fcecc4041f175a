"""PyTorch Lightning: train_dataloader() returns the datapipe loader, nothing else.

python lightning_train.py imagenet.lmdb --devices 8 [--resume last.ckpt]
"""
import argparse

import pytorch_lightning as pl
import torch

import datapipe
from datapipe.train.models import build_model  # or any torchvision model


class Classifier(pl.LightningModule):
    def __init__(self, data: str, batch_size: int, image_size: int) -> None:
        super().__init__()
        self.data, self.batch_size, self.image_size = data, batch_size, image_size
        self.model = build_model("resnet18", len(datapipe.open_dataset(data).classes))

    def train_dataloader(self):
        # A new order and new crops every epoch, the rank's own share, on the rank's GPU.
        return datapipe.make_loader(self.data, split="train", batch_size=self.batch_size, train=True,
                                    image_size=self.image_size)

    def training_step(self, batch, batch_idx):
        images, labels, indices = batch  # normalized NCHW, int64 labels, record indices
        return torch.nn.functional.cross_entropy(self.model(images), labels)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("data")
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=90)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--resume", help="a checkpoint: mid-epoch ones resume at the next batch")
    parser.add_argument("--out", default="lightning_out")
    args = parser.parse_args()
    trainer = pl.Trainer(devices=args.devices, strategy="ddp", max_epochs=args.epochs, default_root_dir=args.out)
    trainer.fit(Classifier(args.data, args.batch_size, args.image_size), ckpt_path=args.resume)
