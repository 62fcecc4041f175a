"""Preemption: SIGTERM, SIGUSR1 and SIGINT stop `datapipe train` after the current optimizer step,
with a checkpoint, instead of killing it.

Clusters end jobs with a signal and a grace period: Slurm's `--signal=USR1@90` (SIGTERM at the time
limit, on scancel and on preemption), Kubernetes' SIGTERM before terminationGracePeriodSeconds run
out, torchrun forwarding what it receives to its workers. The handler only counts the signal. The
loop asks `requested()` at each optimizer-step boundary and at each epoch's start (so a signal during
start-up, an evaluation or the epoch-end bookkeeping is acted on there): where ranks train together,
one all-reduce of three numbers tells every rank what any rank received, so all stop after the same
step even when one rank alone was signalled. The loop then writes OUT/last.pt (rank 0, temp file +
rename) with the loader's position and raises `Preempted`; the CLI exits with PREEMPTED_EXIT and,
on SIGUSR1 under Slurm, requeues the job first (`scontrol requeue`, as Lightning's SLURMEnvironment).

Cost: nothing per step on one process. With several ranks, one all-reduce of 3 float64 per optimizer
step on CPU (gloo: a few microseconds to a millisecond); on CUDA every --log-every steps only, where
the loop reads the device anyway, so it adds no host sync per step (a stop then comes within
--log-every steps).

A second SIGINT before the stop is decided raises KeyboardInterrupt at once (the last checkpoint
stays whole: saves are temp file + rename); once it is decided, further signals are only counted
until the checkpoint is written. The handlers in place before are restored when training ends.
"""
from __future__ import annotations

import contextlib
import logging
import signal
import subprocess
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ..backends.deaths import JOB_SIGNALS
from ..errors import ExpectedError
from .ddp import all_sum

log = logging.getLogger("datapipe.train")

PREEMPTED_EXIT = 75  # EX_TEMPFAIL (sysexits.h, "try again later"): last.pt written, rerun with --resume
INTERRUPTED_EXIT = 130  # a second Ctrl-C stopped at once: 128 + SIGINT, as a shell reports it
SIGNALS = JOB_SIGNALS  # SIGTERM, SIGUSR1, SIGINT: those loader workers are shielded from (backends.deaths)
REQUEUE_SIGNAL = signal.SIGUSR1  # Slurm's --signal=USR1@SECONDS; SIGTERM (scancel, preemption) is not requeued


class Preempted(ExpectedError):
    """Training stopped on a signal after writing `checkpoint`, from which --resume continues."""

    def __init__(self, signals: tuple[signal.Signals, ...], checkpoint: Path, epoch: int, step: int) -> None:
        self.signals, self.checkpoint, self.epoch, self.step = signals, checkpoint, epoch, step
        names = "/".join(s.name for s in signals)
        super().__init__(f"preempted by {names} at epoch {epoch}, step {step}: checkpoint {checkpoint} written, "
                         f"resume with --resume {checkpoint}")

    def __reduce__(self) -> tuple:  # picklable, for launchers that send a rank's error to its parent
        return type(self), (self.signals, self.checkpoint, self.epoch, self.step)


class Preemption:
    """The signal handlers that record a stop request, and the agreement of the ranks on it."""

    def __init__(self, signals: tuple[signal.Signals, ...] = SIGNALS) -> None:
        self.signals = tuple(signals)
        self.received = dict.fromkeys(self.signals, 0)  # times each signal came (the handler's only write)
        self.stopping = False  # the stop is decided: the checkpoint is being written
        self.agreed: tuple[signal.Signals, ...] = ()  # the signals any rank received, at the last agreement
        self.every, self.device = 1, torch.device("cpu")
        self._previous: dict[signal.Signals, Any] = {}
        self._depth = 0

    def _on_signal(self, signum: int, frame: Any) -> None:
        """Count the signal; the loop acts on it at its next boundary. A second SIGINT (Ctrl-C twice)
        before the stop is decided interrupts at once, as Python's own handler would."""
        if signum == signal.SIGINT and self.received[signal.SIGINT] and not self.stopping:
            raise KeyboardInterrupt
        self.received[signum] += 1

    def arm(self, *, device: torch.device | None = None, log_every: int = 1) -> "Preemption":
        """Install the handlers (nested arms: the outermost installs, its disarm restores), and with
        `device` set how often the ranks agree: every step, or every `log_every` on CUDA."""
        if device is not None:
            ranks = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
            self.device, self.every = device, log_every if ranks > 1 and device.type == "cuda" else 1
        if self._depth == 0:
            self._install()
        self._depth += 1
        return self

    def disarm(self) -> None:
        """Undo one arm(); the last puts back the handlers that were there before."""
        self._depth -= 1
        if self._depth == 0:
            for signum, previous in self._previous.items():
                signal.signal(signum, previous)
            self._previous.clear()

    @contextlib.contextmanager
    def armed(self, **kw: Any) -> Iterator["Preemption"]:
        self.arm(**kw)
        try:
            yield self
        finally:
            self.disarm()

    def _install(self) -> None:
        self.received, self.stopping = dict.fromkeys(self.signals, 0), False
        if threading.current_thread() is not threading.main_thread():
            log.info("training outside the main thread: %s stop it as before (no checkpoint on preemption)",
                     "/".join(s.name for s in self.signals))
            return
        for signum in self.signals:
            if signal.getsignal(signum) is None:  # a handler set outside Python: it could not be put back
                log.info("%s keeps its handler (set outside Python): no checkpoint on it", signum.name)
                continue
            self._previous[signum] = signal.signal(signum, self._on_signal)

    def requested(self, step: int | None = None) -> bool:
        """Whether to stop now, at optimizer step `step`'s boundary or (None) an epoch's start. In a
        process group every rank calls it at the same points: it is a collective there."""
        if step is not None and step % self.every:
            return False
        counts = [float(self.received[s]) for s in self.signals]
        if dist.is_available() and dist.is_initialized():
            counts = all_sum(counts, self.device)
        self.agreed = tuple(s for s, n in zip(self.signals, counts) if n)
        if self.agreed and not self.stopping:
            log.info("%s received: stopping here, writing the checkpoint", "/".join(s.name for s in self.agreed))
        self.stopping = bool(self.agreed)
        return self.stopping

    def stopped(self, checkpoint: Path, epoch: int, step: int) -> Preempted:
        """The error that ends training once `checkpoint` is written."""
        return Preempted(self.agreed, checkpoint, epoch, step)

    def worker_death(self, error: Exception, checkpoint: Path) -> Exception:
        """`error` (a loader worker died), told as what it was when a stop signal came too: SIGTERM
        reached the workers themselves (Slurm's scancel and time limit signal every process of the
        step; a group signal spares them: backends.deaths.shield_worker) and the step could not finish."""
        names = "/".join(s.name for s in self.signals if self.received[s])
        if not names:
            return error
        return type(error)(
            f"{names} reached the loader's worker processes too (sent to every process, as Slurm's scancel and time "
            f"limit do) and ended them before the step could finish: no checkpoint now ({checkpoint}, if there, is the "
            "last one). Ask for SIGUSR1 ahead of the end (#SBATCH --signal=USR1@90), which workers ignore: "
            "docs/training.md#preemption")


def slurm_job_id(environ: Mapping[str, str]) -> str | None:
    """The id `scontrol requeue` takes: ARRAYJOB_TASK for an array task, else SLURM_JOB_ID; None
    outside Slurm."""
    array, task = environ.get("SLURM_ARRAY_JOB_ID"), environ.get("SLURM_ARRAY_TASK_ID")
    if array and task:
        return f"{array}_{task}"
    return environ.get("SLURM_JOB_ID") or None


def requeue(job_id: str, *, timeout: float = 60) -> str | None:
    """`scontrol requeue JOB_ID`: Slurm puts the job back in the queue, to rerun its batch script.
    None when it did, else why not, in one line."""
    try:
        done = subprocess.run(["scontrol", "requeue", job_id], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"scontrol requeue {job_id} failed: {exc}"
    if done.returncode:
        return f"scontrol requeue {job_id} failed (exit {done.returncode}): {done.stderr.strip()[:200]}"
    return None
