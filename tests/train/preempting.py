"""Helpers of the preemption tests: a Trainer that signals its own process at a chosen batch, the
same on one rank of a spawned gloo group, and `datapipe train` run as a real process that a test
signals once its log shows a step (every wait has a deadline; a hang kills the session and fails)."""
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from datapipe.train import DistEnv, Trainer
from tests.train.ranks import WORKERS_FORKED
from tests.train.support import config

ROOT = Path(__file__).resolve().parents[2]
TINY = dict(epochs=1, batch_size=6, image_size=16)  # 12 batches over the `learnable` fixture's 72 images


class SignalAt(Trainer):
    """Sends `signals` to its own process while it works on batch `batch` of the epoch (1-based: the
    loader's batches_done once that batch is out), before that batch's optimizer step."""

    def __init__(self, *args, batch: int, signals: tuple[int, ...], **kw) -> None:
        super().__init__(*args, **kw)
        self.batch, self.signals = batch, signals

    def _forward_backward(self, batch, *, sync: bool):
        if self.loader.batches_done == self.batch:
            for signum in self.signals:
                os.kill(os.getpid(), signum)
        return super()._forward_backward(batch, sync=sync)


def signalled_rank_run(rank: int, world_size: int, data: str, out: str, signal_rank: int, batch: int):
    """One rank of a 2-rank run at batch 6 (6 batches a rank); only `signal_rank` is signalled (SIGTERM)."""
    signals = (signal.SIGTERM,) if rank == signal_rank else ()
    trainer = SignalAt(config(data, out, **{**TINY, **WORKERS_FORKED}), DistEnv(rank, world_size, rank),
                       batch=batch, signals=signals)
    return trainer.fit()


class TrainProcess:
    """`python -m datapipe train ...` in a session of its own, its stderr read line by line."""

    def __init__(self, args: list[str], *, env: dict[str, str] | None = None) -> None:
        self.process = subprocess.Popen([sys.executable, "-m", "datapipe", "train", *args], cwd=ROOT,
                                        env={**os.environ, **(env or {})}, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.lines: list[str] = []
        self._queue: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stderr:
            self._queue.put(line)
        self._queue.put(None)

    def wait_for(self, text: str, timeout: float = 120) -> None:
        """Read the log until a line holds `text`; fail if the process ends or `timeout` passes first."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self.kill()
                raise AssertionError(f"no {text!r} in {timeout} s: {''.join(self.lines)[-3000:]}") from None
            if line is None:
                raise AssertionError(f"ended before {text!r}: {''.join(self.lines)[-3000:]}")
            self.lines.append(line)
            if text in line:
                return

    def finish(self, timeout: float = 120) -> tuple[int, str]:
        """(exit status, its whole stderr) once it ends; killed (and failed) past `timeout`."""
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"still running after {timeout} s: {''.join(self.lines)[-3000:]}") from None
        while (line := self._queue.get(timeout=timeout)) is not None:
            self.lines.append(line)
        return self.process.returncode, "".join(self.lines)

    def kill(self) -> None:
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
