"""What Ray Train's workers run: docs/examples/ray_train.py's training function, by a name they can
import (Ray gives them the driver's working directory, not docs/examples), first with a probe of
ray.train.torch.prepare_data_loader given a datapipe loader over config["probe_data"]; it writes
AUDIT/probe-rank{r}.json."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import ray.train
import ray.train.torch
from ray.train.torch import prepare_data_loader

import datapipe

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "docs" / "examples"))
from ray_train import train_func  # noqa: E402  (the example script, as the page quotes it)


def probe(config: dict) -> dict:
    """What prepare_data_loader does with a loader: the habitual call refused in one line; with
    add_dist_sampler=False, move_to_device=False the loader as it is; with add_dist_sampler=False
    alone, Ray's wrapper, which reads one batch ahead: a state taken in step 1 counts 2 batches,
    and a loader resumed from it serves batch 3 first."""
    options = dict(split="train", batch_size=config["batch_size"], train=True, image_size=config["image_size"],
                   device=ray.train.torch.get_device())
    loader = datapipe.make_loader(config["probe_data"], **options)
    found = {"len": len(loader)}
    try:
        prepare_data_loader(loader)
    except AttributeError as exc:
        found["refused"] = str(exc)
    found["unchanged"] = prepare_data_loader(loader, add_dist_sampler=False, move_to_device=False) is loader
    wrapped = iter(prepare_data_loader(loader, add_dist_sampler=False))
    found["first"] = next(wrapped)[2].tolist()  # step 1 in hand
    state = loader.state_dict()
    found["batches_done"] = state["batches_done"]
    resumed = datapipe.make_loader(config["probe_data"], **options)
    resumed.load_state_dict(state)
    found["resumed_first"] = next(iter(resumed))[2].tolist()
    return found


def interrupted_once(config: dict) -> None:
    """The first attempt probes prepare_data_loader, trains config["stop_at"] steps (the example saves
    a checkpoint there), waits until Ray Train has registered it, and fails; Ray Train starts the
    workers again, and the example resumes from ray.train.get_checkpoint() to the end."""
    if ray.train.get_checkpoint() is not None:
        return train_func(config)
    rank = ray.train.get_context().get_world_rank()
    with open(os.path.join(config["audit"], f"probe-rank{rank}.json"), "w") as fh:
        json.dump(probe(config), fh)
    train_func({**config, "max_steps": config["stop_at"]})
    # Ray Train keeps a checkpoint once every rank's report of it has reached the controller, which takes
    # at most one report a rank per poll, reports before errors; a worker failing at once can beat a
    # slower rank's report (an upload) to it, and the restart resumes from the checkpoint before. Each
    # report passes a barrier of all ranks and returns when the controller has taken this rank's previous
    # one: after two more, every rank's checkpoint report was in its queue before the poll that sees an error.
    for _ in range(2):
        ray.train.report({"step": config["stop_at"], "waited": True})
    raise RuntimeError(f"rank {rank} fails after step {config['stop_at']} (the test's fault)")
