"""An Accelerate run as a user writes it: model and optimizer through accelerator.prepare, the datapipe
loader as it is, registered for checkpointing. Each rank writes what it was served to
OUT/served-rank{r}.jsonl; state is saved mid-epoch and at an epoch's end with save_state.

python accelerate_run.py DATA OUT [--resume DIR] [--save-step N] [--save-epoch E] [--max-steps N]
    [--prepare-loader] [--workers N] [--processes N] [--then DATA OUT ...]
(CPU processes, 2 by default, each this script under torchrun, which Accelerate reads as MULTI_CPU with
gloo.) DATA: a dataset, or mix:NAME=PATH,... (tests/trainers/mixed.py: each batch's sources, labels and
per-sample pixel sums are written too). Each `--then` starts another launch, with its own arguments, once
the one before has ended. torchrun starts each rank as a new interpreter: accelerate's notebook_launcher
forks them from a process whose launcher threads run, and a rank forked while one of them held a lock
waited on it for good (twice in this suite: once in stderr's buffer, once in a CI run).
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import torch
from accelerate import Accelerator

import datapipe

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.trainers.mixed import FIELDS, batch_log, data_of  # noqa: E402


def train(args: argparse.Namespace) -> None:
    out = Path(args.out)
    accelerator = Accelerator(cpu=True)
    data = data_of(args.data)
    fields = FIELDS if isinstance(data, datapipe.Mix) else ("image", "label")
    loader = datapipe.make_loader(data, split="train", batch_size=4, train=True, image_size=16, fields=fields,
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
        for batch in loader:
            images, labels, indices = batch.images, batch.labels, batch.indices
            loss = torch.nn.functional.cross_entropy(model(images.mean(dim=(2, 3))), labels)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            log.write(json.dumps({"epoch": epoch, "step": step, "indices": indices.tolist(),
                                  "pixels": float(images.sum()), **(batch_log(batch, loader) if loader.mix else {})})
                      + "\n")
            step += 1
            if step == args.save_step:
                accelerator.save_state(str(out / "mid"))
            if step == args.max_steps:
                break
        if step == args.max_steps:
            break
        if epoch == args.save_epoch:
            accelerator.save_state(str(out / "epoch-end"))
    log.close()
    accelerator.end_training()


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    parser.add_argument("data")
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--resume")
    parser.add_argument("--save-step", type=int)
    parser.add_argument("--save-epoch", type=int)
    parser.add_argument("--max-steps", type=int, help="stop after this step (a --save-step there is saved first)")
    parser.add_argument("--prepare-loader", action="store_true")
    parser.add_argument("--processes", type=int, default=2)
    return parser


def main() -> None:
    if "LOCAL_RANK" in os.environ:  # a rank, started by torchrun
        train(parser().parse_args())
        # Leave without finalizing the interpreter: torch 2.13's gloo worker thread may destroy a finished
        # allreduce (DDP's) while Py_FinalizeEx runs; its thread-local state's Python object then takes the
        # GIL, the thread exits under a noexcept destructor and std::terminate aborts the rank (about 1 run
        # in 20 here; a core showed ProcessGroupGloo::runLoop -> ~AsyncAllreduceWork -> gil_scoped_acquire).
        # Everything the rank writes is closed by then (its log; save_state's files).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    launches = [[]]
    for arg in sys.argv[1:]:
        launches.append([]) if arg == "--then" else launches[-1].append(arg)
    for argv in launches:
        args = parser().parse_args(argv)
        with socket.socket() as probe:  # a free port on loopback
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(args.processes),
                        "--master_addr", "127.0.0.1", "--master_port", str(port), __file__, *argv], check=True)


if __name__ == "__main__":
    main()
