"""An s3:// dataset (moto on loopback) read by ranks that are multiprocessing children started by
`spawn` or a forkserver, each forking its own workers; and the rule behind it: a process calls
obstore directly only when it is known to fork nothing afterwards (datapipe.storage.isolate).

obstore's runtime does not survive a fork: a child forked after its parent made one request hangs on
its first. Every test here has a deadline: a hang kills the processes and fails the test."""
from __future__ import annotations

import json
import multiprocessing
import os
import signal
import time
import types
from collections import Counter
from pathlib import Path

import pytest
import torch

from datapipe import make_loader, open_dataset
from datapipe.backends.dataloader import _seed_worker
from datapipe.storage import RemoteStore, StoreError
from datapipe.storage.isolate import call_in_child, forks_nothing, may_fork_workers
from tests.storage.conftest import upload_folder
from tests.storage.spawned_ranks import direct_then_fork, read_epoch

DEADLINE_S = 60  # a healthy run takes 2-8 s (two interpreters importing torch on 2 shared cores)
WORLD = 2


def finish(processes: list, timeout: float) -> None:
    """Wait for every process until the deadline; kill the ones left (with everything they started:
    each is the leader of its process group) and fail."""
    deadline = time.monotonic() + timeout
    for p in processes:
        p.join(max(0.0, deadline - time.monotonic()))
    hung = [p.pid for p in processes if p.is_alive()]
    if hung or any(p.exitcode for p in processes):
        for p in processes:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            if p.is_alive():
                p.kill()
            p.join(5)
    assert not hung, f"processes {hung} did not finish in {timeout} s (hung) and were killed"
    assert not any(p.exitcode for p in processes), [p.exitcode for p in processes]


def check_served(out: Path, local: Path) -> None:
    """The ranks together served every record of the local copy once (one padded repeat when the
    records do not divide evenly), each with its label."""
    ds = open_dataset(local)
    labels = {i: ds[i].label for i in range(len(ds))}
    served = []
    for rank in range(WORLD):
        result = json.loads((out / f"rank{rank}.json").read_text())
        assert "error" not in result, result["error"]
        served += [tuple(pair) for pair in result["served"]]
    counts = Counter(index for index, _ in served)
    padding = -len(ds) % WORLD
    assert sorted(counts) == list(range(len(ds))) and len(served) == len(ds) + padding
    assert sum(c - 1 for c in counts.values()) == padding
    assert all(label == labels[index] for index, label in served)


@pytest.fixture
def s3_dataset(s3, packed_wds):
    url = s3.bucket("ranks") + "/fixture.wds"
    upload_folder(packed_wds, url)
    return url


# The DataLoader workers: forked from the rank (start_method="fork", what hung), or started the way
# the rank was (None: a spawned rank spawns them, a forkserver's rank asks the forkserver).
WORKERS = pytest.mark.parametrize("workers", [pytest.param("fork", marks=pytest.mark.full), None],
                                 ids=["forked-workers", "default-workers"])  # forked: make test-full and CI


@WORKERS
def test_an_s3_dataset_read_by_ranks_started_by_torch_spawn(s3_dataset, packed_wds, tmp_path, workers):
    context = torch.multiprocessing.spawn(read_epoch, args=(WORLD, s3_dataset, str(tmp_path), "dataloader", workers),
                                          nprocs=WORLD, join=False)
    finish(context.processes, DEADLINE_S)
    check_served(tmp_path, packed_wds)


@WORKERS
def test_an_s3_dataset_read_by_ranks_started_by_a_forkserver(s3_dataset, packed_wds, tmp_path, workers):
    forkserver = multiprocessing.get_context("forkserver")  # one server per pytest process, started once
    environ = {k: v for k, v in os.environ.items() if k.startswith("AWS_") or k == "TMPDIR"}
    ranks = [forkserver.Process(target=read_epoch,
                                args=(rank, WORLD, s3_dataset, str(tmp_path), "dataloader", workers, environ))
             for rank in range(WORLD)]
    for rank in ranks:
        rank.start()
    finish(ranks, DEADLINE_S)
    check_served(tmp_path, packed_wds)


def test_an_s3_dataset_through_dali_in_spawned_ranks(s3_dataset, packed_wds, tmp_path):
    """DALI on a CPU forks its source workers from the rank."""
    pytest.importorskip("nvidia.dali")
    context = torch.multiprocessing.spawn(read_epoch, args=(WORLD, s3_dataset, str(tmp_path), "dali", None),
                                          nprocs=WORLD, join=False)
    finish(context.processes, DEADLINE_S)
    check_served(tmp_path, packed_wds)


def test_a_direct_call_in_a_child_forked_after_direct_calls_raises_at_once(s3, tmp_path):
    url = s3.bucket("forked-after-use")
    call_in_child(RemoteStore(url).upload, "a.bin", b"abc")
    out = tmp_path / "outcome.txt"
    process = multiprocessing.get_context("fork").Process(target=direct_then_fork, args=(url, "a.bin", str(out)))
    started = time.monotonic()
    process.start()
    finish([process], 30)
    outcome = out.read_text()
    assert outcome.startswith(StoreError.__name__) and "forked" in outcome and "hang" in outcome, outcome
    assert "\n" not in outcome and time.monotonic() - started < 15


def _marks() -> tuple[bool, bool]:
    """(may this process fork workers, may a child forked from it)."""
    return may_fork_workers(), call_in_child(may_fork_workers)


def _marked_then_forked() -> tuple[bool, bool]:
    forks_nothing()
    return _marks()


def test_the_forks_nothing_mark_belongs_to_the_process_that_set_it():
    assert _marks() == (True, True)  # pytest's process: a top-level process may fork
    assert call_in_child(_marked_then_forked) == (False, True)
    assert may_fork_workers()


class _Marks(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 2

    def __getitem__(self, index: int) -> tuple[bool, bool]:
        return _marks()


def test_a_dataloader_worker_calls_directly_and_its_children_and_parent_do_not():
    loader = torch.utils.data.DataLoader(_Marks(), num_workers=1, worker_init_fn=_seed_worker,
                                         multiprocessing_context="fork", collate_fn=lambda items: items)
    assert [m for batch in loader for m in batch] == [(False, True)] * 2
    assert may_fork_workers()


def _call_source(source) -> bool:
    labels = source(types.SimpleNamespace(epoch_idx=0, iteration=0))[1]
    assert len(labels) == 4
    return may_fork_workers()


def test_a_dali_source_marks_the_worker_it_runs_in_not_the_process_that_made_it(packed_wds):
    pytest.importorskip("nvidia.dali")
    loader = make_loader(packed_wds, backend="dali", batch_size=4, image_size=16, device="cpu")
    source = loader.source  # the loader stays referenced: its finalizer removes the epoch table
    loader.table.write(0, 0, loader.order.encode(0))  # DALI epoch 0 serves epoch 0 from its start
    assert _call_source(source)  # called where it was made (a test, the loader itself): no mark
    assert call_in_child(_call_source, source) is False  # a process other than its maker's: a worker
    assert may_fork_workers()
