"""Threads that open one LMDB dataset at once (the threads backend, a thread-pool loader such as
torchdata.nodes' ParallelMapper) share this process's one environment: py-lmdb refuses a second
open of a path in a process, so a race between two first reads failed one of them."""
from __future__ import annotations

import shutil
import threading

from datapipe import open_dataset
from datapipe.formats import lmdb as lmdb_format

THREADS = 8


def test_threads_reading_a_fresh_lmdb_at_once_all_succeed(packed_lmdb, tmp_path):
    for attempt in range(5):  # a fresh path each time: its environment is not open yet
        copy = tmp_path / f"copy{attempt}.lmdb"
        shutil.copytree(packed_lmdb, copy)
        ds = open_dataset(copy)
        start, errors, records = threading.Barrier(THREADS), [], []

        def read(k: int) -> None:
            start.wait(timeout=30)
            try:
                records.append(ds.record(k % len(ds)).key)
            except Exception as exc:  # noqa: BLE001 - collected and asserted below
                errors.append(exc)

        threads = [threading.Thread(target=read, args=(k,)) for k in range(THREADS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert errors == [] and len(records) == THREADS
        assert sum(path.startswith(str(copy.resolve())) for path in lmdb_format._ENVS) == 1
