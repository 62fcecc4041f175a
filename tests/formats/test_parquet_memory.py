"""The Parquet reader's memory: an open file of 200,000 rows holds and sends a worker no per-row labels.
Measured in a fresh interpreter, not in a forked child (tests/forked.py): tracemalloc in a busy pytest
worker once counted another thread's 2.6 MB, and pyarrow in a child forked from a worker that had used
it died of SIGSEGV twice in make test."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.formats.test_parquet_reader import N, TRAIN, big_file

MEASURE = """import pickle, sys, tracemalloc
from datapipe.formats.parquet import ParquetDataset
path, n = sys.argv[1], int(sys.argv[2])
ParquetDataset(path)  # pyarrow's modules imported outside the measure
tracemalloc.start()
before, _ = tracemalloc.get_traced_memory()
ds = ParquetDataset(path)
held, _ = tracemalloc.get_traced_memory()
tracemalloc.stop()
last = ds.record(n - 1)  # its row group read now (kept: one a process, not measured)
sent = pickle.dumps(ds)
print(held - before, len(ds.classes), last.label, last.fields.text, len(sent), pickle.loads(sent).record(n - 1) == last,
      sep="\\t")
"""


def test_an_open_file_holds_and_sends_no_per_row_labels(tmp_path):
    path = big_file(tmp_path / TRAIN)
    done = subprocess.run([sys.executable, "-c", MEASURE, str(path), str(N)], capture_output=True, text=True,
                          timeout=300, cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr[-3000:]
    held, classes, label, text, sent, same = done.stdout.strip().split("\t")
    assert int(held) / N <= 1, f"{int(held) / N:.1f} bytes a record held after the open"
    assert int(classes) == 977 and int(label) == (2 * N - 2) % 977 and text == f"caption {N - 1}" and same == "True"
    assert int(sent) / N <= 1, f"a worker is sent {int(sent) / N:.1f} bytes a record"
