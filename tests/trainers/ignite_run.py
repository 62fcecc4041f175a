"""docs/examples/ignite_train.py's setup() on 2 ranks (idist.Parallel, gloo, spawn), run as its users
run it and resumed from its own checkpoints, with Engine and with DeterministicEngine. Each rank
appends what every iteration trained on to OUT/served-rank{r}.jsonl: the run it belongs to, Ignite's
epoch and iteration, the loader's epoch and batches done after that batch, the labels and the pixel sum.
Given MIX (mix:NAME=PATH,..., tests/trainers/mixed.py), Engine's whole run and its mid-epoch resumption
over that Mix follow, in the same launch.

python ignite_run.py DATA OUT [MIX]
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import ignite.distributed as idist
import torch
from ignite.engine import Events

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "docs" / "examples"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from ignite_train import setup  # noqa: E402  (the example script, as the page quotes it)

from tests.trainers.mixed import data_of  # noqa: E402

MID_STEP = 6  # epoch 1 (0-based) after 2 of its 4 batches
EPOCH_END_STEP = 4  # the end of epoch 0
EPOCHS = 3


def run(config: dict, tag: str, *, resume: str | None = None, restore_loader: str | None = None) -> None:
    """One run of the example's trainer; `restore_loader`: also load the loader's state from that
    checkpoint (what DeterministicEngine must not be given)."""
    trainer, loader, checkpoint = setup({**config, "resume": resume})
    if restore_loader:
        loader.load_state_dict(torch.load(restore_loader, weights_only=True)["loader"])
    if resume is None:
        trainer.add_event_handler(Events.ITERATION_COMPLETED(once=MID_STEP), checkpoint)
    log = open(Path(config["log"]) / f"served-rank{idist.get_rank()}.jsonl", "a")

    @trainer.on(Events.ITERATION_COMPLETED)
    def record(engine) -> None:
        images, labels = engine.state.batch  # what the default prepare_batch unpacked
        log.write(json.dumps({"run": tag, "ignite_epoch": engine.state.epoch, "iteration": engine.state.iteration,
                              "epoch": loader.epoch, "done": loader.batches_done, "labels": labels.tolist(),
                              "pixels": round(float(images.sum()), 2)}) + "\n")

    trainer.run(loader, max_epochs=EPOCHS)
    log.close()


def training(local_rank: int, args: dict) -> None:
    for kind in ("engine", "deterministic"):
        out = Path(args["out"]) / kind
        config = {"data": args["data"], "batch_size": 4, "image_size": 8, "model": "linear", "epochs": EPOCHS,
                  "deterministic": kind == "deterministic", "out": str(out), "log": args["out"]}
        run(config, f"{kind}/whole")
        idist.barrier()  # rank 0 wrote the checkpoints
        for step in (MID_STEP, EPOCH_END_STEP):
            run(config, f"{kind}/resumed-{step}", resume=str(out / f"checkpoint_{step}.pt"))
    engine_mid = str(Path(args["out"]) / "engine" / f"checkpoint_{MID_STEP}.pt")
    deterministic = {**config, "out": str(Path(args["out"]) / "naive")}
    run(deterministic, "naive", resume=str(out / f"checkpoint_{MID_STEP}.pt"), restore_loader=engine_mid)
    if args["mix"]:
        mix = {**config, "data": data_of(args["mix"]), "deterministic": False, "out": str(Path(args["out"]) / "mix")}
        run(mix, "mix/whole")
        idist.barrier()
        run(mix, f"mix/resumed-{MID_STEP}", resume=str(Path(mix["out"]) / f"checkpoint_{MID_STEP}.pt"))


if __name__ == "__main__":
    data, out, mix = (sys.argv[1:4] + [None])[:3]
    Path(out).mkdir(parents=True, exist_ok=True)
    with idist.Parallel(backend="gloo", nproc_per_node=2) as parallel:
        parallel.run(training, {"data": data, "out": out, "mix": mix})
