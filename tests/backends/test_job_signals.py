"""A stop signal sent to a training job's whole process group (torchrun's SIGTERM to each rank's
group, a terminal's Ctrl-C, Slurm's --signal=USR1 to every process of the step) is the training
process's to handle (datapipe.train.preempt): loader workers are in a group of their own and deaf to
SIGINT and SIGUSR1, also while a spawned worker is still starting, so the epoch goes on. Before,
the workers died of it (WorkerDied) or, spawned, were killed by SIGUSR1 and SIGINT."""
from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import pytest

from datapipe import open_dataset

from tests.processes import run_in_session

SCRIPT = Path(__file__).with_name("job_signals.py")
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("backend, start_method, signum", [
    ("dataloader", "fork", signal.SIGTERM),
    ("dataloader", "spawn", signal.SIGUSR1),
    ("dataloader", "spawn", signal.SIGINT),
    ("dali", "spawn", signal.SIGTERM),
], ids=["dataloader-fork-SIGTERM", "dataloader-spawn-SIGUSR1", "dataloader-spawn-SIGINT", "dali-spawn-SIGTERM"])
def test_workers_live_through_a_stop_signal_to_the_whole_group(packed_lmdb, backend, start_method, signum):
    done = run_in_session([sys.executable, str(SCRIPT), str(packed_lmdb), backend, start_method, str(int(signum))],
                          timeout=120, cwd=ROOT, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    served = json.loads(done.stdout.strip().splitlines()[-1])
    assert served["received"] == [int(signum)]
    assert served["samples"] == len(open_dataset(packed_lmdb)) and "Traceback" not in done.stderr  # all served


def test_a_forked_worker_dies_of_sigterm_whatever_handler_its_parent_had():
    """torch's DataLoader stops a worker that is slow to exit with SIGTERM. A forked worker inherited
    the training process's handler (Lightning's broadcasts over the rank's process group: from a worker,
    that hung both ranks for good); it now dies of SIGTERM as a worker should."""
    import os
    import time

    from datapipe.backends.deaths import shield_worker

    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)  # a trainer's handler
    ready, told = os.pipe()
    try:
        pid = os.fork()
        if pid == 0:  # the worker
            try:
                shield_worker()
                os.write(told, b"1")
                time.sleep(20)  # a handler that returns lets the sleep go on
            finally:
                os._exit(7)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert os.read(ready, 1) == b"1"  # shielded: now the SIGTERM tests what it should
    os.kill(pid, signal.SIGTERM)
    _, status = os.waitpid(pid, 0)
    os.close(ready), os.close(told)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM, status
