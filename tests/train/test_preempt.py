"""Preemption (datapipe.train.preempt): SIGTERM, SIGUSR1 and SIGINT, sent as real signals to real
processes, let the optimizer step finish, write last.pt with the loader's position and stop (exit
status 75 from the command line); the resume goes on as if nothing had happened. On one process, on
two gloo ranks of which one alone is signalled, and through `datapipe train` (Slurm's requeue with a
stand-in `scontrol` on PATH)."""
import contextlib
import os
import re
import signal

import pytest
import torch

from datapipe.train import Trainer, train
from datapipe.train.checkpoint import load
from tests.train.preempting import TINY, SignalAt, TrainProcess, signalled_rank_run
from tests.train.ranks import spawn_ranks
from tests.train.support import config

PREEMPTED = 75  # datapipe.train.preempt.PREEMPTED_EXIT, as docs/training.md documents it
HANDLED = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)
CLI = ["--model", "resnet18", "--epochs", "1", "--batch-size", "6", "--image-size", "16", "--lr", "0.05",
       "--warmup-epochs", "0.5", "--workers", "1", "--backend", "dataloader", "--log-every", "1"]  # = config(**TINY)
STOPPED = re.compile(r"^datapipe train: preempted by (\w+) at epoch 0, step (\d+): checkpoint (\S+) written; "
                     r"resume: the same command with --resume (\S+) \(e\.g\. datapipe train .*", re.M)


@contextlib.contextmanager
def callers_handlers():
    """The handlers a script had before it called train(); they record what reaches them. fit()
    takes the signals while it runs and puts these back when it ends."""
    got = []

    def record(signum, frame):
        got.append(signum)

    before = {signum: signal.signal(signum, record) for signum in HANDLED}
    try:
        yield got
        assert all(signal.getsignal(signum) is record for signum in HANDLED), "fit() did not restore the handlers"
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


def same(a, b) -> bool:
    """Nested dicts and lists of tensors and plain values: equal (tensors within float tolerance)."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.allclose(a.float(), b.float(), rtol=1e-4, atol=1e-5)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def test_a_signal_mid_accumulation_finishes_the_optimizer_step_and_checkpoints_it_as_max_steps_would(
        learnable, tmp_path):
    """accum_steps 2 (12 batches, 6 steps): SIGUSR1 during batch 3, the first half of step 2. Step 2
    completes with batch 4, and last.pt is the one --max-steps 2 writes (same weights, optimizer and
    loader position), whose resume tests/train/test_train.py shows equal to an unbroken run."""
    options = dict(TINY, accum_steps=2)
    with callers_handlers() as got:
        trainer = SignalAt(config(learnable, tmp_path / "signal", **options), batch=3, signals=(signal.SIGUSR1,))
        with pytest.raises(Exception, match=r"preempted by SIGUSR1 at epoch 0, step 2: checkpoint .*last\.pt written"):
            trainer.fit()
    assert got == []  # fit() handled it
    train(config(learnable, tmp_path / "max_steps", **options, max_steps=2))
    saved, expected = load(tmp_path / "signal" / "last.pt"), load(tmp_path / "max_steps" / "last.pt")
    assert (saved["epoch"], saved["step"]) == (expected["epoch"], expected["step"]) == (0, 2)
    assert (saved["loader"]["batches_done"], saved["loader"]["samples_done"]) == (4, 24)
    for part in ("model", "optimizer", "scheduler", "loader"):
        assert same(saved[part], expected[part]), part
    assert saved["sums"]["images"] == expected["sums"]["images"] == 24


def test_ctrl_c_twice_stops_at_once_without_finishing_the_step(learnable, tmp_path):
    with callers_handlers():
        trainer = SignalAt(config(learnable, tmp_path, **TINY), batch=2, signals=(signal.SIGINT, signal.SIGINT))
        with pytest.raises(KeyboardInterrupt):
            trainer.fit()
    assert trainer.step == 1 and not (tmp_path / "last.pt").exists()


class SignalInSave(SignalAt):
    """Also sends SIGINT and SIGTERM to itself as the stop's checkpoint begins."""

    def _save(self) -> None:
        if getattr(self, "preemption", None) is not None and self.preemption.stopping:
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGTERM)
        super()._save()


def test_signals_during_the_stops_checkpoint_let_it_finish(learnable, tmp_path):
    """A second Ctrl-C, or torchrun's SIGTERM after Slurm's, while last.pt is written: it is written."""
    with callers_handlers():
        trainer = SignalInSave(config(learnable, tmp_path, **TINY), batch=2, signals=(signal.SIGINT,))
        with pytest.raises(Exception, match="preempted by SIGINT at epoch 0, step 2"):
            trainer.fit()
    assert load(tmp_path / "last.pt")["step"] == 2


def test_a_signal_during_start_up_checkpoints_position_zero_which_resumes(learnable, tmp_path):
    """Armed before the Trainer is built, as the command line does: a signal while the model and the
    loaders are made stops at the first epoch's start, before the loader starts."""
    from datapipe.train.preempt import Preemption

    with callers_handlers(), Preemption().armed() as preemption:
        trainer = Trainer(config(learnable, tmp_path, **TINY))
        os.kill(os.getpid(), signal.SIGTERM)
        with pytest.raises(Exception, match="preempted by SIGTERM at epoch 0, step 0"):
            trainer.fit(preemption)
    saved = load(tmp_path / "last.pt")
    assert (saved["step"], saved["loader"]["epoch"], saved["loader"]["samples_done"]) == (0, 0, 0)
    resumed = Trainer(config(learnable, tmp_path, **TINY, resume=str(tmp_path / "last.pt")))
    assert (resumed.epoch, resumed.step, resumed.loader.state_dict()["samples_done"]) == (0, 0, 0)


def test_a_signal_to_one_rank_stops_both_after_the_same_step_with_one_checkpoint(learnable, tmp_path):
    """2 gloo ranks, SIGTERM to rank 1 alone during its batch 2: both stop after step 2 (the old
    loop: rank 1 died, rank 0 waited in its next collective). One checkpoint, written by rank 0, at
    the position both ranks reached (how such a checkpoint resumes: tests/train/test_ranks.py)."""
    outcomes = spawn_ranks(signalled_rank_run, 2, learnable, str(tmp_path), 1, 2)
    assert [o.get("error") for o in outcomes] == ["Preempted", "Preempted"], outcomes
    assert all("preempted by SIGTERM at epoch 0, step 2:" in o["message"] for o in outcomes), outcomes
    saved = load(tmp_path / "last.pt")
    assert (saved["world_size"], saved["step"], saved["loader"]["samples_done"]) == (2, 2, 24)
    assert saved["sums"]["images"] == 24  # both ranks' images, summed


def fake_slurm(tmp_path, out) -> dict[str, str]:
    """Our stand-in for the cluster: SLURM_JOB_ID, and an `scontrol` on PATH that records its
    arguments and whether last.pt was there when it ran."""
    folder = tmp_path / "bin"
    folder.mkdir()
    script = folder / "scontrol"
    script.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/scontrol.log\n'
                      f'[ -f {out}/last.pt ] && echo "last.pt written" >> {tmp_path}/scontrol.log\nexit 0\n')
    script.chmod(0o755)
    return {"PATH": f"{folder}{os.pathsep}{os.environ['PATH']}", "SLURM_JOB_ID": "4242"}


def tensorboard_steps(folder, tag: str) -> list[int]:
    accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    events = accumulator.EventAccumulator(str(folder))
    events.Reload()
    return [e.step for e in events.Scalars(tag)]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_the_command_line_stops_mid_epoch_with_a_checkpoint_exit_75_and_one_line(learnable, tmp_path, signum):
    """Signalled once its log shows step 2 (of 12): exit 75, one line naming the checkpoint and the
    resume, no traceback, TensorBoard flushed; not requeued, though under Slurm (not SIGUSR1)."""
    out = tmp_path / "run"
    board = [] if signum == signal.SIGTERM else ["--tensorboard", "off"]  # one flush check is enough
    run = TrainProcess([learnable, *CLI, *board, "--out", str(out)], env=fake_slurm(tmp_path, out))
    run.wait_for("epoch 0 step 2 ")
    os.kill(run.process.pid, signum)
    code, log = run.finish()
    assert code == PREEMPTED, log[-3000:]
    assert "Traceback" not in log
    stopped = STOPPED.findall(log)
    assert len(stopped) == 1 and log.rstrip().endswith(stopped[0][3] + ")"), log[-2000:]
    name, step, checkpoint, resume = stopped[0]
    assert (name, checkpoint, resume) == (signum.name, str(out / "last.pt"), str(out / "last.pt"))
    saved = load(out / "last.pt")
    assert saved["epoch"] == 0 and saved["step"] == int(step) and 2 <= int(step) < 12
    assert saved["loader"]["samples_done"] == 6 * int(step)
    assert not (tmp_path / "scontrol.log").exists()
    if signum == signal.SIGTERM:  # TensorBoard was flushed; the resume sees every image of the epoch once
        assert tensorboard_steps(out / "tensorboard", "train/loss") == list(range(1, int(step) + 1))
        metrics = train(config(learnable, out, **TINY, resume=str(out / "last.pt")))
        assert (metrics[0]["images"], metrics[0]["steps"]) == (72, 12)


@pytest.mark.parametrize("signum, start, backend", [
    (signal.SIGTERM, "fork", "dataloader"), (signal.SIGUSR1, "spawn", "dataloader"),
    pytest.param(signal.SIGINT, "spawn", "dataloader", marks=pytest.mark.full), (signal.SIGTERM, "fork", "dali")],
    ids=["SIGTERM", "SIGUSR1-spawn", "SIGINT-spawn", "SIGTERM-dali"])
def test_a_signal_to_the_whole_process_group_spares_the_loader_workers(learnable, tmp_path, signum, start, backend):
    """torchrun sends SIGTERM to each rank's process group, a terminal's Ctrl-C goes to the foreground
    group, Slurm's --signal=USR1 to every process of the step: the DataLoader worker, in a group of its
    own and deaf to SIGINT and SIGUSR1 (also when spawned: it inherits no handler), keeps serving while
    the run checkpoints (before: the worker died of the signal and the run ended with WorkerDied, no
    checkpoint)."""
    out = tmp_path / "run"
    run = TrainProcess([learnable, *CLI, "--tensorboard", "off", "--requeue", "off", "--start-method", start,
                        "--out", str(out), "--backend", backend])
    run.wait_for("epoch 0 step 2 ")
    os.killpg(run.process.pid, signum)
    code, log = run.finish()
    assert code == PREEMPTED, log[-3000:]
    assert "Traceback" not in log and len(STOPPED.findall(log)) == 1, log[-3000:]
    assert load(out / "last.pt")["step"] >= 2


def test_sigusr1_under_slurm_writes_the_checkpoint_then_requeues_the_job(learnable, tmp_path):
    out = tmp_path / "run"
    run = TrainProcess([learnable, *CLI, "--tensorboard", "off", "--out", str(out)], env=fake_slurm(tmp_path, out))
    run.wait_for("epoch 0 step 1 ")
    os.kill(run.process.pid, signal.SIGUSR1)
    code, log = run.finish()
    assert code == PREEMPTED, log[-3000:]
    assert (tmp_path / "scontrol.log").read_text().splitlines() == ["requeue 4242", "last.pt written"]
    assert log.rstrip().endswith("; Slurm job 4242 requeued") and load(out / "last.pt")["step"] >= 1


def test_the_requeue_follows_the_signal_the_flag_and_slurms_job_id(tmp_path, monkeypatch):
    """Only SIGUSR1, only under Slurm, not with --requeue off; an array task is JOB_TASK."""
    import argparse
    from pathlib import Path

    from datapipe.cli.train import after_preemption
    from datapipe.train.preempt import PREEMPTED_EXIT, Preempted, slurm_job_id

    assert PREEMPTED_EXIT == PREEMPTED

    monkeypatch.setenv("PATH", fake_slurm(tmp_path, tmp_path)["PATH"])
    args = argparse.Namespace(data="data.lmdb", out="run")
    cases = [((signal.SIGTERM,), "auto", {"SLURM_JOB_ID": "7"}), ((signal.SIGUSR1,), "off", {"SLURM_JOB_ID": "7"}),
             ((signal.SIGUSR1,), "auto", {}), ((signal.SIGTERM, signal.SIGUSR1), "auto", {"SLURM_JOB_ID": "8"})]
    for signals, requeue, environ in cases:
        line = after_preemption(Preempted(signals, Path("run/last.pt"), 0, 3), argparse.Namespace(**vars(args),
                                 requeue=requeue), environ)
        assert line.startswith("datapipe train: preempted by ") and "--resume run/last.pt" in line
    assert (tmp_path / "scontrol.log").read_text().split() == ["requeue", "8"]
    assert slurm_job_id({"SLURM_JOB_ID": "9", "SLURM_ARRAY_JOB_ID": "5", "SLURM_ARRAY_TASK_ID": "3"}) == "5_3"
