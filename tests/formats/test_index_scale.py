"""Indices that scale: bytes per record in memory, bounded open files, foreign shards indexed once."""
from __future__ import annotations

import os
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from datapipe.formats import open_dataset
from datapipe.formats.wds import WdsWriter
from datapipe.records import Manifest, Record, SplitInfo, record_digest

pytestmark = pytest.mark.forked  # tracemalloc in a child with one thread (tests/forked.py)

JPEG = bytes.fromhex("ffd8ffe000104a46494600010100000100010000ffd9")  # bytes only: nothing decodes here


def synthetic_wds(folder: Path, records: int, shard_bytes: int) -> Path:
    """A .wds dataset of `records` tiny records written straight through the writer."""
    writer = WdsWriter(folder, size_hint=0, shard_bytes=shard_bytes)
    info = SplitInfo()
    for i in range(records):
        key = f"r{i:08d}"
        record = Record(key, JPEG + i.to_bytes(4, "little"), i % 10, f"c{i % 10}/{key}.jpg",
                        record_digest(key, i % 10, JPEG + i.to_bytes(4, "little")))
        writer.write("train", i, record)
        info.add(record)
    writer.close(Manifest("wds", [f"c{k}" for k in range(10)], {"train": info}))
    return folder


def test_a_wds_index_costs_at_most_48_bytes_a_record_in_memory(tmp_path):
    path = synthetic_wds(tmp_path / "big.wds", 30_000, shard_bytes=1 << 20)
    tracemalloc.start()
    try:
        ds = open_dataset(path)
        used, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(ds) == 30_000 and ds[29_999].key == "r00029999"
    assert used / len(ds) <= 48, f"{used / len(ds):.0f} bytes per record"


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_open_files_stay_bounded_however_many_shards(tmp_path):
    path = synthetic_wds(tmp_path / "many.wds", 3_000, shard_bytes=8 << 10)
    ds = open_dataset(path)
    shards = len(ds.shard_entries())
    assert shards > 100
    before = open_fds()
    for i in np.random.default_rng(0).permutation(len(ds))[:2000]:
        assert ds[int(i)].key == f"r{int(i):08d}"
    assert open_fds() - before <= 64


def test_foreign_shards_are_indexed_once_then_opened_from_the_cached_index(foreign_shards, tmp_path, monkeypatch):
    from datapipe.formats import wds_foreign

    first = wds_foreign.ForeignShardsDataset(foreign_shards, cache_dir=tmp_path)
    records = [first.record(i) for i in range(len(first))]
    assert list((tmp_path / "index").glob("*.npz"))

    def no_scan(*_):
        raise AssertionError("the shards were scanned again")

    monkeypatch.setattr(wds_foreign, "samples_before_damage", no_scan)
    again = wds_foreign.ForeignShardsDataset(foreign_shards, cache_dir=tmp_path)
    assert [again.record(i) for i in range(len(again))] == records
    assert sum(a.nbytes for a in again.index.values()) / len(again) <= 48
