"""Loader runs with injected worker behaviour, each in a process of its own (tests/backends/
test_worker_processes.py runs them under a deadline and reads the JSON line they print last).

    python tests/backends/worker_faults.py overlap DATA PY_WORKERS FOLDER
    python tests/backends/worker_faults.py kill BACKEND DATA FOLDER
    python tests/backends/worker_faults.py idle BACKEND DATA FOLDER [late-observer]
    python tests/backends/worker_faults.py cli BACKEND DATA FOLDER

The faults live in the dataset's record reads, patched into its class here and inherited by the
loader's forked workers; the parent process reads nothing through them.
"""
from __future__ import annotations

import json
import multiprocessing
import os
import signal
import sys
import threading
import time
from pathlib import Path

BATCH = 4
# The worker read that waits for the consumer's step, then dies: one that runs while the first batch
# is being consumed. A DataLoader worker (2, prefetch_factor 2) reads its third batch then; DALI's
# one source worker reads the fourth (the pipeline prepares 3 before it serves the first).
FAULT_READ = {"dataloader": 2 * BATCH + 1, "dali": 3 * BATCH + 1}
WAIT_S = 20  # how long a fault waits for its cue; a run never hangs on it


def patch_reads(data: str, hook) -> None:
    """Call hook(index) before every record read of the dataset class that opens `data`."""
    from datapipe import open_dataset

    cls = type(open_dataset(data))
    read = cls._read

    def _read(self, index):
        hook(index)
        return read(self, index)

    cls._read = _read


def wait_for(path: Path) -> None:
    deadline = time.monotonic() + WAIT_S
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.01)


def wait_dead(pid: int) -> None:
    """Until process `pid` is a zombie or gone (bounded by WAIT_S)."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return
        except (FileNotFoundError, ProcessLookupError):
            return
        time.sleep(0.01)


def overlap(data: str, py_workers: int, folder: Path) -> dict:
    """The DALI backend over `data` with py_workers source workers. Each worker's first record read
    waits (up to WAIT_S) at a barrier for py_workers parties: it opens only when every worker is
    reading at the same moment, whatever the timing. Reports each worker's outcome."""
    from datapipe import make_loader

    parent, barrier = os.getpid(), multiprocessing.get_context("fork").Barrier(py_workers)
    outcomes = folder / "outcomes"
    waited = []

    def first_read_meets_the_others(index: int) -> None:
        if os.getpid() == parent or waited:
            return
        waited.append(index)
        try:
            barrier.wait(WAIT_S)
            outcome = "met"
        except threading.BrokenBarrierError:
            outcome = "alone"
        with open(outcomes, "a") as f:
            f.write(f"{os.getpid()} {outcome}\n")

    patch_reads(data, first_read_meets_the_others)
    loader = make_loader(data, backend="dali", batch_size=2, image_size=16, num_workers=2 * py_workers, train=False)
    served = [i for _, _, idx in loader for i in idx.tolist()]
    expected = [int(i) for batch in loader.order.batches(0, loader.order.start) for i in batch]
    return {"workers": outcomes.read_text().split("\n")[:-1], "served": served, "expected": expected}


def kill_once(folder: Path, nth: int):
    """In every worker, its nth read waits for `folder/step` (the consumer is in its step); the
    first worker there kills itself with SIGKILL, as the out-of-memory killer would."""
    parent, reads = os.getpid(), {}

    def fault(index: int) -> None:
        pid = os.getpid()
        reads[pid] = reads.get(pid, 0) + 1
        if pid == parent or reads[pid] != nth:
            return
        wait_for(folder / "step")
        try:
            os.close(os.open(folder / "killed", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return
        os.kill(pid, signal.SIGKILL)

    return fault


def epoch(loader, step: Path | None = None) -> dict:
    """One epoch; after the first batch, a 1 s 'training step' (the fault's cue). What came of it."""
    from datapipe.errors import ExpectedError

    started, indices = time.monotonic(), []
    try:
        for number, (_, _, idx) in enumerate(loader):
            indices += idx.tolist()
            if number == 0 and step is not None:
                step.touch()
                for _ in range(100):  # Python code runs between the sleeps: torch's SIGCHLD handler runs
                    time.sleep(0.01)  # there, not later inside the loader
    except Exception as exc:  # what a training script would see
        return {"error": type(exc).__name__, "expected": isinstance(exc, ExpectedError), "message": str(exc),
                "seconds": time.monotonic() - started}
    return {"error": None, "indices": sorted(indices), "seconds": time.monotonic() - started}


def kill(backend: str, data: str, folder: Path) -> dict:
    """A worker killed during the consumer's step; then the same loader iterated again."""
    from datapipe import make_loader

    patch_reads(data, kill_once(folder, FAULT_READ[backend]))
    loader = make_loader(data, backend=backend, batch_size=BATCH, image_size=16, num_workers=2)
    first = epoch(loader, folder / "step")
    return {"first": first, "again": epoch(loader), "records": len(loader.dataset)}


LATE = []  # the delays late_pool_observer made: the report says the injection fired


def late_pool_observer(delay_s: float) -> None:
    """DALI's pool observer thread reacts to a worker's exit `delay_s` late, as under load when it is
    not scheduled for a while: a pool close that comes meanwhile is seen together with the death."""
    import multiprocessing.connection as connection

    wait = connection.wait

    def late_wait(objects, timeout=None):
        ready = wait(objects, timeout)
        observer = threading.current_thread().name.endswith("(_observer_thread)")
        if observer and any(isinstance(r, int) for r in ready):  # a worker's sentinel, not the close's pipe
            time.sleep(delay_s)
            LATE.append(delay_s)
            ready = wait(objects, 0)
        return ready

    connection.wait = late_wait


def idle(backend: str, data: str, folder: Path, late_observer: bool = False) -> dict:
    """A worker killed between two epochs, while it waits for work; then the next two epochs. With
    `late_observer`, DALI's pool notices the death a second late."""
    from datapipe import make_loader

    if late_observer:
        late_pool_observer(1.0)
    parent, noted = os.getpid(), []

    def note_worker(index: int) -> None:
        if os.getpid() != parent and not noted:
            noted.append(index)
            with open(folder / "workers", "a") as f:
                f.write(f"{os.getpid()}\n")

    patch_reads(data, note_worker)
    loader = make_loader(data, backend=backend, batch_size=BATCH, image_size=16, num_workers=2)
    first = epoch(loader)
    victim = int((folder / "workers").read_text().split()[0])
    os.kill(victim, signal.SIGKILL)
    wait_dead(victim)  # dead (a zombie its parent has not reaped, or gone) before the next epoch starts
    second = epoch(loader)
    return {"first": first, "second": second, "third": epoch(loader), "records": len(loader.dataset),
            "late_observer": len(LATE)}


def cli(backend: str, data: str, folder: Path) -> int:
    """`datapipe bench` while a worker is killed (most likely during its simulated training step)."""
    from datapipe.cli.main import main

    (folder / "step").touch()
    patch_reads(data, kill_once(folder, FAULT_READ[backend]))
    return main(["bench", data, "--suites", "pipeline", "--backends", backend, "--batch-size", str(BATCH),
                 "--image-size", "16", "--workers", "2", "--warmup", "0", "--repeats", "1",
                 "--simulate-step", "300"])


if __name__ == "__main__":
    scenario, *args = sys.argv[1:]
    if scenario == "overlap":
        print(json.dumps(overlap(args[0], int(args[1]), Path(args[2]))))
    elif scenario == "kill":
        print(json.dumps(kill(args[0], args[1], Path(args[2]))))
    elif scenario == "idle":
        print(json.dumps(idle(args[0], args[1], Path(args[2]), late_observer=args[3:] == ["late-observer"])))
    else:
        sys.exit(cli(args[0], args[1], Path(args[2])))
