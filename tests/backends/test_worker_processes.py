"""Loader worker processes: the DALI source keeps all its workers reading at once, and a worker
killed mid-epoch (the out-of-memory killer's SIGKILL) ends the epoch with one clear error, never a
hang. Each run happens in a process of its own (tests/backends/worker_faults.py) under a deadline:
a hung run is killed, with everything it started, and fails the test."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.processes import run_in_session

FAULTS = Path(__file__).with_name("worker_faults.py")
ROOT = Path(__file__).resolve().parents[2]
DEADLINE_S = 120


def run_faults(*args, check: bool = True, deadline: int = DEADLINE_S) -> subprocess.CompletedProcess:
    return run_in_session([sys.executable, str(FAULTS), *map(str, args)], deadline, cwd=ROOT, check=check)


def report(*args, deadline: int = DEADLINE_S) -> dict:
    return json.loads(run_faults(*args, deadline=deadline).stdout.splitlines()[-1])


def test_dali_source_workers_all_read_at_once_and_the_order_is_exact(packed_lmdb, tmp_path):
    """Every one of the 3 source workers must be inside a read at the same moment for the barrier
    their first reads wait at to open: DALI must hand each a batch before the first comes back."""
    out = report("overlap", packed_lmdb, 3, tmp_path)
    outcomes = [line.split()[1] for line in out["workers"]]
    assert outcomes == ["met"] * 3, f"the source workers did not read at the same time: {out['workers']}"
    assert len({line.split()[0] for line in out["workers"]}) == 3
    assert out["served"] == out["expected"]  # the epoch's exact order, every record once


WHO = {"dataloader": "dataloader backend: a DataLoader worker process", "dali": "dali backend: a DALI source worker process"}


def check_message(message: str, backend: str) -> None:
    assert "\n" not in message.strip()
    assert message.startswith(WHO[backend]), message
    assert "died, killed by SIGKILL, most likely by the kernel's out-of-memory killer" in message, message
    assert "Use fewer workers (num_workers, --workers), a smaller batch size, or give the job more memory" in message


@pytest.mark.parametrize("backend", ["dataloader", "dali"])
def test_a_worker_killed_during_the_step_ends_the_epoch_with_one_clear_error(backend, packed_lmdb, tmp_path):
    out = report("kill", backend, packed_lmdb, tmp_path)
    first = out["first"]
    assert (tmp_path / "killed").exists()
    assert first["error"] == "WorkerDied" and first["expected"], first
    check_message(first["message"], backend)
    again = out["again"]  # iterating again starts new workers: DALI builds a new pipeline, torch a new iterator
    assert again["error"] is None and again["indices"] == list(range(out["records"]))


@pytest.mark.parametrize("backend", ["dataloader", "dali"])
def test_a_worker_killed_between_epochs_fails_the_next_one_at_once(backend, packed_lmdb, tmp_path):
    """Killed while it waited for work: DALI, asked for work, would wait forever for it to wake. The
    epoch after starts new workers (persistent ones, the default, too) and serves every record."""
    out = report("idle", backend, packed_lmdb, tmp_path, deadline=60)
    assert out["first"]["error"] is None and out["first"]["indices"] == list(range(out["records"]))
    second = out["second"]
    assert second["error"] == "WorkerDied" and second["expected"], second
    check_message(second["message"], backend)
    assert out["third"]["error"] is None and out["third"]["indices"] == list(range(out["records"]))


def test_a_dali_pool_that_sees_the_death_late_fails_the_next_epoch_at_once(packed_lmdb, tmp_path):
    """Under load, DALI's pool observer may wake after the loader saw the death and dropped the
    pipeline: closed first, the pool took it for a clean close and notified the dead worker, and
    the next epoch hung (#38). The loader now waits for the pool to stop before it drops it."""
    out = report("idle", "dali", packed_lmdb, tmp_path, "late-observer", deadline=60)
    assert out["late_observer"] >= 1, "DALI's observer thread was not found by its name: nothing was delayed"
    assert out["first"]["error"] is None
    second = out["second"]
    assert second["error"] == "WorkerDied" and second["expected"], second
    check_message(second["message"], "dali")
    assert out["third"]["error"] is None and out["third"]["indices"] == list(range(out["records"]))


@pytest.mark.parametrize("backend", ["dataloader", "dali"])
def test_datapipe_bench_prints_a_killed_worker_as_one_line(backend, packed_lmdb, tmp_path):
    done = run_faults("cli", backend, packed_lmdb, tmp_path, check=False)
    assert (tmp_path / "killed").exists()
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("datapipe bench: error: "), done.stderr[-3000:]
    check_message(last.removeprefix("datapipe bench: error: "), backend)
