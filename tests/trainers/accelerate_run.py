"""An Accelerate run as a user writes it: model and optimizer through accelerator.prepare, the datapipe
loader as it is, registered for checkpointing. Each rank writes what it was served to
OUT/served-rank{r}.jsonl; state is saved mid-epoch and at an epoch's end with save_state.

python accelerate_run.py DATA OUT [--resume DIR] [--save-step N] [--save-epoch E] [--prepare-loader]
    [--workers N]
(2 CPU processes through accelerate.notebook_launcher: `accelerate launch --cpu` starts one, or needs MPI)
"""
from __future__ import annotations

import argparse
import json
import socket
from pathlib import Path

import torch
from accelerate import Accelerator, notebook_launcher

import datapipe


def train(args: argparse.Namespace) -> None:
    out = Path(args.out)
    accelerator = Accelerator(cpu=True)
    loader = datapipe.make_loader(args.data, split="train", batch_size=4, train=True, image_size=16,
                                  num_workers=args.workers)
    model = torch.nn.Linear(3, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer = accelerator.prepare(model, optimizer)
    if args.prepare_loader:  # harmless: Accelerate hands back objects it does not know
        assert accelerator.prepare(loader) is loader
    accelerator.register_for_checkpointing(loader)
    if args.resume:
        accelerator.load_state(args.resume)
    out.mkdir(parents=True, exist_ok=True)
    log = open(out / f"served-rank{accelerator.process_index}.jsonl", "a")
    log.write(json.dumps({"epoch_start": loader.epoch, "len": len(loader), "world": accelerator.num_processes}) + "\n")
    step = loader.epoch * len(loader) + loader.batches_done
    for epoch in range(loader.epoch, args.epochs):
        for images, labels, indices in loader:
            loss = torch.nn.functional.cross_entropy(model(images.mean(dim=(2, 3))), labels)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            log.write(json.dumps({"epoch": epoch, "step": step, "indices": indices.tolist(),
                                  "pixels": float(images.sum())}) + "\n")
            step += 1
            if step == args.save_step:
                accelerator.save_state(str(out / "mid"))
        if epoch == args.save_epoch:
            accelerator.save_state(str(out / "epoch-end"))
    log.close()
    accelerator.end_training()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("data")
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--resume")
    parser.add_argument("--save-step", type=int)
    parser.add_argument("--save-epoch", type=int)
    parser.add_argument("--prepare-loader", action="store_true")
    with socket.socket() as probe:  # a free port on loopback
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    notebook_launcher(train, args=(parser.parse_args(),), num_processes=2, use_port=str(port))


if __name__ == "__main__":
    main()
