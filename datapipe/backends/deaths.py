"""Worker processes that die mid-epoch (the kernel's out-of-memory killer sends SIGKILL): one
clear error, `WorkerDied`, instead of a hang, a bare traceback or an unrelated message.

torch's DataLoader notices a dead worker in two places: its SIGCHLD handler raises "DataLoader
worker (pid X) is killed by signal: Killed." in whatever code the main thread runs at that moment
(in a training loop, mostly the step, where nothing of ours can catch it), and its periodic check
raises "... exited unexpectedly" in the loader. `DeferredDeaths` keeps the handler's error for the
loader's next fetch, where the loader turns it into a WorkerDied. DALI's pool stops all its source
workers once one exits and its pipeline then fails with "Worker data receiving interrupted"; the
DALI backend reads the exit codes of the pool's processes (datapipe.backends.dali).
"""
from __future__ import annotations

import contextlib
import os
import re
import signal
import threading
import time
from collections.abc import Iterator

from ..errors import ExpectedError

# torch's words: "DataLoader worker (pid 12) is killed by signal: Killed. ", "DataLoader worker (pid 12)
# exited unexpectedly with exit code 1. ...", "DataLoader worker (pid(s) 12, 13) exited unexpectedly"
TORCH_DEAD_WORKER = re.compile(r"DataLoader worker \(pid(?:\(s\))? (?P<pids>[\d, ]+)\) (?:is killed by signal: "
                               r"(?P<signal>[^.]+)|exited unexpectedly(?: with exit code (?P<code>-?\d+))?)")
SIGNAL_NUMBERS = {signal.strsignal(s): int(s) for s in signal.valid_signals() if signal.strsignal(s)}
DEATH_GRACE_S = 2.0  # how long a broken connection to a worker waits for the kernel to report its death


class WorkerDied(ExpectedError, RuntimeError):
    """A loader worker process died, most often at the hands of the kernel's out-of-memory killer:
    the epoch cannot go on. The message names the backend, the process and what to change."""


JOB_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)  # what clusters and terminals stop a job with


@contextlib.contextmanager
def workers_start_deaf() -> Iterator[None]:
    """Processes started in this block (loader workers; multiprocessing's resource tracker and
    forkserver) begin with the job's stop signals blocked, so one sent to the whole process group
    while a worker imports (a spawned worker's first seconds) waits for `shield_worker` instead of
    killing it. Blocked in this thread only: meanwhile another thread takes a signal, and Python
    runs its handler as usual; a signal that finds every thread blocked is delivered after the block."""
    before = signal.pthread_sigmask(signal.SIG_BLOCK, JOB_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def shield_worker() -> None:
    """In a loader worker process: a process group of its own, and SIGINT and SIGUSR1 ignored. A stop
    signal meant for the job (torchrun's SIGTERM to each rank's group, a terminal's Ctrl-C, Slurm's
    --signal=USR1 to every process of the step) then reaches the training process, which stops after
    its step and checkpoints (datapipe.train.preempt), instead of killing the workers under it. One
    sent while the worker started (workers_start_deaf) is dropped. The workers still end with their
    parent (torch's and DALI's watchdogs); SIGTERM sent to a worker itself keeps ending it (the pools
    stop their workers with it)."""
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)
    with contextlib.suppress(ValueError):  # signal.signal: a worker's main thread only
        for number in (signal.SIGINT, signal.SIGUSR1):
            signal.signal(number, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # drops a SIGTERM pending since the start
        signal.pthread_sigmask(signal.SIG_UNBLOCK, JOB_SIGNALS)
        # the default, not what a fork inherited (the trainer's counting handler): the pools stop
        # their workers with SIGTERM, and a worker that only counted it would never stop
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


UNKNOWN_EXIT = -(1 << 16)  # a process ended whose exit status another waiter collected


def exit_description(exitcode: int) -> str:
    """A process's exit code in words: 'killed by SIGKILL', 'exited with code 1'."""
    if exitcode == UNKNOWN_EXIT:
        return "ended unexpectedly (its exit status went to another waiter)"
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exited with code {exitcode}"


def worker_died(backend: str, what: str, pid: int | str, how: str) -> WorkerDied:
    """The one-line error for a dead worker; `how` says how it ended ("killed by SIGKILL", ...)."""
    if "SIGKILL" in how:
        how += ", most likely by the kernel's out-of-memory killer (see `dmesg`)"
    elif "unexpectedly" in how:
        how += ": probably killed, e.g. by the kernel's out-of-memory killer (see `dmesg`)"
    elif "SIGBUS" in how:
        how += ": probably out of shared memory (/dev/shm too small)"
    return WorkerDied(f"{backend} backend: {what} (pid {pid}) died, {how}. Use fewer workers "
                      "(num_workers, --workers), a smaller batch size, or give the job more memory")


def torch_worker_died(backend: str, exc: BaseException) -> WorkerDied | None:
    """A WorkerDied for torch's report of a dead DataLoader worker, or None for any other error. A
    worker killed while it handed a batch over shows first as a broken connection (the kernel closes
    a killed process's sockets before it can be waited for): then torch's own check of its workers,
    repeated for up to DEATH_GRACE_S, says whether one died."""
    texts = [str(e) for e in _chain(exc)]
    found = _most_precise(TORCH_DEAD_WORKER.search(t) for t in texts + DEFERRED.kept)
    reraised = "in DataLoader worker process" in texts[0]  # a worker's own error, passed on by torch
    if found is None and isinstance(exc, (ConnectionError, EOFError)) and not reraised:
        found = _torch_reports_dead_worker()
    if found is None:
        return None
    DEFERRED.kept.clear()  # reported now
    pids, signal_text, code = found.group("pids"), found.group("signal"), found.group("code")
    if signal_text is not None:
        number = SIGNAL_NUMBERS.get(signal_text.strip())
        how = exit_description(-number) if number else f"killed by signal: {signal_text.strip()}"
    else:
        how = exit_description(int(code)) if code is not None else "exited unexpectedly"
    return worker_died(backend, "a DataLoader worker process", pids, how)


def _chain(exc: BaseException | None) -> Iterator[BaseException]:
    """The error and those it came from: torch raises "exited unexpectedly" from the "killed by
    signal" its SIGCHLD handler raised inside its wait for data."""
    for _ in range(8):
        if exc is None:
            return
        yield exc
        exc = exc.__cause__ or exc.__context__


def _most_precise(matches: Iterator[re.Match | None]) -> re.Match | None:
    """The match that names a signal or an exit code, else any match, else None."""
    found = [m for m in matches if m is not None]
    return next((m for m in found if m.group("signal") or m.group("code")), found[0] if found else None)


def _torch_reports_dead_worker() -> re.Match | None:
    from torch.utils.data._utils.signal_handling import _error_if_any_worker_fails

    deadline = time.monotonic() + DEATH_GRACE_S
    while True:
        if DEFERRED.kept:  # the SIGCHLD handler ran first
            return TORCH_DEAD_WORKER.search(DEFERRED.take())
        try:
            _error_if_any_worker_fails()  # checks the workers of every live DataLoader iterator
        except RuntimeError as failure:
            return TORCH_DEAD_WORKER.search(str(failure))
        if time.monotonic() > deadline:
            return None
        time.sleep(0.02)


class DeferredDeaths:
    """Wraps torch's SIGCHLD handler (once per process, after torch installed it): a dead worker
    reported while no batch is being fetched is kept, and the next fetch raises it, so it reaches
    the loader (which makes it a WorkerDied) instead of interrupting the training step. Any other
    error of the handler, and one raised during a fetch, passes as before."""

    def __init__(self) -> None:
        self.fetching = 0
        self.kept: list[str] = []
        self.installed = False

    def install(self) -> None:
        if self.installed or threading.current_thread() is not threading.main_thread():
            return
        previous = signal.getsignal(signal.SIGCHLD)
        if not callable(previous):  # torch installed none (it does so only in the main thread)
            return

        def handler(signum, frame) -> None:
            try:
                previous(signum, frame)
            except RuntimeError as exc:
                if self.fetching or not TORCH_DEAD_WORKER.search(str(exc)):
                    raise
                self.kept.append(str(exc))

        signal.signal(signal.SIGCHLD, handler)
        self.installed = True

    def take(self) -> str:
        """The first death kept (the others are of the same event or come back as the loader stops)."""
        message, self.kept[:] = self.kept[0], []
        return message

    @contextlib.contextmanager
    def fetch(self) -> Iterator[None]:
        """Around one fetch of a batch: raise a death kept since the last one."""
        if self.kept:
            raise RuntimeError(self.take())
        self.fetching += 1
        try:
            yield
        finally:
            self.fetching -= 1


DEFERRED = DeferredDeaths()
