"""Training runs on several gloo ranks in spawned processes, for the tests. Every run has a
deadline: a rank stuck in a collective is killed and reported, so a test fails instead of hanging."""
import json
import os
import tempfile
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.multiprocessing.spawn import start_processes

from datapipe.doctor.selftest.collective import join_within
from datapipe.train import DistEnv, Trainer
from tests.train.support import config, free_port

GLOO_TIMEOUT = timedelta(seconds=20)  # a collective that a peer never joins fails after this
# A spawned rank's default start method is spawn: each loader worker would import torch anew (~1.5 s a
# run on 2 cores). These tests are about the loop across ranks, not how workers start (tests/storage,
# tests/trainers start them every way).
WORKERS_FORKED = dict(start_method="fork")


def spawn_ranks(fn, world_size: int, *args, timeout: float = 180) -> list[dict]:
    """fn(rank, world_size, *args) on each rank of a gloo group; each rank's outcome in rank order:
    {"result": ...}, {"error": type name, "message": ...}, or {"error": "Timeout"} when it was killed."""
    with tempfile.TemporaryDirectory() as folder:
        context = start_processes(_rank_main, args=(fn, world_size, free_port(), folder, args), nprocs=world_size,
                                  join=False, start_method="spawn")
        join_within(context, timeout)
        reports = [Path(folder) / f"rank{rank}.json" for rank in range(world_size)]
        return [json.loads(r.read_text()) if r.is_file() else {"error": "Timeout"} for r in reports]


def _rank_main(rank: int, fn, world_size: int, port: int, folder: str, args: tuple) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world_size))
    torch.set_num_threads(1)  # as torchrun does (OMP_NUM_THREADS=1): a thread per core in each rank oversubscribes
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=GLOO_TIMEOUT)
        outcome = {"result": fn(rank, world_size, *args)}
    except BaseException as exc:  # reported to the test, whatever it is
        outcome = {"error": type(exc).__name__, "message": str(exc)}
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    Path(folder, f"rank{rank}.json").write_text(json.dumps(outcome))


class NanLossTrainer(Trainer):
    """A Trainer whose loss reads NaN on one rank at one step (its gradients stay finite, so only
    that rank's check can see it)."""

    def __init__(self, *args, nan_rank: int, nan_step: int, **kw) -> None:
        super().__init__(*args, **kw)
        self.nan_rank, self.nan_step = nan_rank, nan_step

    def _forward_backward(self, batch, *, sync: bool):
        loss, correct = super()._forward_backward(batch, sync=sync)
        nan = (self.env.rank, self.step) == (self.nan_rank, self.nan_step)
        return (loss * float("nan") if nan else loss), correct


def nan_loss_run(rank: int, world_size: int, data: str, out: str, nan_rank: int, nan_step: int, log_every: int):
    """Two epochs at batch 6 (6 steps per epoch on each of 2 ranks)."""
    trainer = NanLossTrainer(config(data, out, epochs=2, batch_size=6, log_every=log_every, **WORKERS_FORKED),
                             DistEnv(rank, world_size, rank), nan_rank=nan_rank, nan_step=nan_step)
    return trainer.fit()


def train_run(rank: int, world_size: int, data: str, out: str, options: dict):
    """train() on this rank with config(data, out, **options); returns the metrics."""
    trainer = Trainer(config(data, out, **{**WORKERS_FORKED, **options}), DistEnv(rank, world_size, rank))
    return trainer.fit()
