"""Hugging Face Accelerate: prepare the model and optimizer, leave the loader as it is, and register it
so that save_state/load_state carry its position.

accelerate launch --num_processes 8 accelerate_train.py imagenet.lmdb [--resume run/epoch-3]
torchrun --nproc-per-node 8 accelerate_train.py imagenet.lmdb          (the same, without a config)
"""
import argparse

import torch
from accelerate import Accelerator

import datapipe
from datapipe.train.models import build_model

parser = argparse.ArgumentParser()
parser.add_argument("data")
parser.add_argument("--epochs", type=int, default=90)
parser.add_argument("--batch-size", type=int, default=256)
parser.add_argument("--image-size", type=int, default=224)
parser.add_argument("--resume", help="a folder written by save_state")
parser.add_argument("--out", default="accelerate_out")
args = parser.parse_args()

accelerator = Accelerator(cpu=not torch.cuda.is_available())  # on CPUs, cpu=True makes it multi-process
loader = datapipe.make_loader(args.data, split="train", batch_size=args.batch_size, train=True,
                              image_size=args.image_size, device=accelerator.device)
model = build_model("resnet18", len(loader.dataset.classes))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
model, optimizer = accelerator.prepare(model, optimizer)  # not the loader: it already shards by rank
accelerator.register_for_checkpointing(loader)
if args.resume:
    accelerator.load_state(args.resume)  # the loader resumes at the batch after the saved one

for epoch in range(loader.epoch, args.epochs):  # loader.epoch: where a resumed run stands
    for images, labels, indices in loader:  # each iteration of the loader is the next epoch
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    accelerator.save_state(f"{args.out}/epoch-{epoch}")
    accelerator.print(f"epoch {epoch}: loss {loss.item():.3f}")
accelerator.end_training()
