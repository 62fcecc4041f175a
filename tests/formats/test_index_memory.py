"""Indexes that stay on disk: opening a dataset of N records, reading some and building the epoch's first
batch costs a process at most 1 byte a record of its own memory, and a worker it is sent to (pickled,
as spawn and DALI's source workers get it) receives no per-record array.

The datasets are real files in each format's real layout, made cheap: the .wds shard is sparse (real
samples only where the test reads; served remotely, only the shards read exist), the other tools' shards
have a DALI index whose samples share a few members. NumPy's allocations are traced by tracemalloc, so
an index read into memory shows."""
from __future__ import annotations

import functools
import hashlib
import http.server
import pickle
import tracemalloc
from pathlib import Path

import h5py
import numpy as np
import pytest

from datapipe.formats import open_dataset
from datapipe.formats.base import write_dir_manifest
from datapipe.formats.hdf5 import MANIFEST_ATTR, _SplitBuilder
from datapipe.formats.lmdb import LmdbWriter
from datapipe.formats.tar import BLOCK, END_OF_ARCHIVE, IDX_VERSION, member_header, padded
from datapipe.formats.wds import ShardFile
from datapipe.formats.wds_index import offsets_file
from datapipe.formats.wds_foreign import ForeignShardsDataset
from datapipe.records import Manifest, Record, SplitInfo, record_digest
from datapipe.order.sharding import EpochOrder
from tests.storage.conftest import RangeHandler, isolated_cache, serve, stop_serving

pytestmark = pytest.mark.forked  # tracemalloc in a child with one thread (tests/forked.py)

N = 100_000
BATCH = 32
JPEG = bytes.fromhex("ffd8ffe000104a46494600010100000100010000ffd9")  # bytes only: nothing decodes here
CLASSES = [f"c{k}" for k in range(10)]
SAMPLE_BYTES = 4 * 2 * BLOCK  # this project's .wds sample of a tiny record: four members of one block each


def record(i: int) -> Record:
    key, label, data = f"r{i:08d}", i % 10, JPEG + i.to_bytes(4, "little")
    return Record(key, data, label, f"c{label}/{key}.jpg", record_digest(key, label, data))


def first_batch() -> np.ndarray:
    return EpochOrder(N, BATCH, seed=0).batches(0)[0]


READ = sorted({0, N - 1, *first_batch().tolist()})


def write_hdf5(path: Path) -> Path:
    """N records through the writer's own split builder (without its spool: that is not measured here)."""
    info = SplitInfo(samples=N, bytes=sum(len(record(i).data) for i in range(N)))
    with h5py.File(path, "w") as f:
        builder = _SplitBuilder(f, "train", info)
        for start in range(0, N, 20_000):
            builder.write([record(i) for i in range(start, min(start + 20_000, N))])
        builder.check_full()
        f.attrs[MANIFEST_ATTR] = Manifest("hdf5", CLASSES, {"train": info}).to_json()
    return path


def write_lmdb(folder: Path) -> Path:
    writer, info = LmdbWriter(folder, size_hint=N * 200, shard_bytes=0), SplitInfo()
    for i in range(N):
        writer.write("train", i, record(i))
        info.add(record(i))
    writer.close(Manifest("lmdb", CLASSES, {"train": info}))
    return folder


def write_sparse_wds(folder: Path) -> Path:
    """One shard of N samples, SAMPLE_BYTES each, a hole except the samples in READ, which hold what
    the writer writes; the offsets file and the manifest as the writer makes them."""
    folder.mkdir()
    scratch = ShardFile(folder, "scratch", 0)
    for i in READ:
        scratch.add_record(i, record(i))
    scratch.file.close()
    blob = scratch.path.read_bytes()
    scratch.path.unlink()
    assert len(blob) == SAMPLE_BYTES * len(READ)
    shard = {"name": "train-000000.tar", "samples": N, "bytes": N * SAMPLE_BYTES + END_OF_ARCHIVE, "sha256": "0" * 64}
    with open(folder / shard["name"], "wb") as fh:
        fh.truncate(shard["bytes"])
        for k, i in enumerate(READ):
            fh.seek(i * SAMPLE_BYTES)
            fh.write(blob[k * SAMPLE_BYTES:(k + 1) * SAMPLE_BYTES])
    name, offsets = offsets_file("train", [np.arange(N, dtype=np.int64) * SAMPLE_BYTES])
    (folder / name).write_bytes(offsets)
    info = SplitInfo(samples=N, bytes=N * len(record(0).data), shards=[shard],
                     index={"name": name, "bytes": len(offsets), "sha256": hashlib.sha256(offsets).hexdigest()})
    write_dir_manifest(folder, Manifest("wds", CLASSES, {"train": info}))
    return folder


def write_foreign_shard(folder: Path) -> str:
    """A tar of one `.cls` and one `.jpg` member per label, and a DALI index of N samples pointing at them."""
    folder.mkdir()
    members, lines, offset = [], [], 0
    for label in range(10):
        for ext, payload in (("cls", str(label).encode()), ("jpg", JPEG + bytes([label]))):
            members += [member_header(f"s{label}.{ext}", len(payload)), payload, b"\0" * (-len(payload) % BLOCK)]
            lines.append((ext, offset + BLOCK, len(payload), f"s{label}.{ext}"))
            offset += BLOCK + padded(len(payload))
    (folder / "f-000000.tar").write_bytes(b"".join(members) + b"\0" * END_OF_ARCHIVE)
    pairs = [" ".join(f"{e} {o} {s} {n}" for e, o, s, n in lines[2 * (i % 10):2 * (i % 10) + 2]) for i in range(N)]
    (folder / "f-000000.idx").write_text(f"{IDX_VERSION} {N}\n" + "\n".join(pairs) + "\n", encoding="ascii")
    return str(folder / "f-000000.tar")


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    """Per format, what opens its dataset of N records (built once per module)."""
    root = tmp_path_factory.mktemp("index-memory")
    paths = {"hdf5": write_hdf5(root / "big.h5"), "lmdb": write_lmdb(root / "big.lmdb"),
             "wds": write_sparse_wds(root / "big.wds")}
    pattern = write_foreign_shard(root / "foreign")
    ForeignShardsDataset(pattern, cache_dir=root / "cache")  # indexed once; each open below maps that index
    return {**{fmt: functools.partial(open_dataset, path) for fmt, path in paths.items()},
            "wds-shards": functools.partial(ForeignShardsDataset, pattern, cache_dir=root / "cache")}


def open_read_and_batch(opener):
    """Open, read the records of the epoch's first batch and both ends; the dataset and the bytes of
    memory this process allocated for it (still held)."""
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        ds = opener()
        labels = [ds[int(i)].label for i in first_batch()] + [ds[0].label, ds[N - 1].label]
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(ds) == N and len(labels) == BATCH + 2
    return ds, held - before


@pytest.mark.parametrize("fmt", ["hdf5", "lmdb", "wds", "wds-shards"])
def test_an_open_dataset_holds_at_most_a_byte_a_record_in_each_process_and_sends_none_to_workers(datasets, fmt):
    datasets[fmt]()  # built (and its format's modules imported) outside the measure
    ds, held = open_read_and_batch(datasets[fmt])
    assert held / N <= 1, f"{fmt}: {held / N:.1f} bytes a record held after the open, reads and first batch"
    sent = pickle.dumps(ds)
    assert len(sent) / N <= 1, f"{fmt}: a worker is sent {len(sent) / N:.1f} bytes a record"
    worker = pickle.loads(sent)
    assert [worker.record(int(i)) for i in first_batch()] == [ds.record(int(i)) for i in first_batch()]
    if fmt in ("hdf5", "lmdb", "wds"):
        assert ds.record(N - 1) == record(N - 1)


REMOTE_SHARDS = 100  # the remote split: N records in shards of N / REMOTE_SHARDS, the first and last real


def write_remote_wds(folder: Path) -> Path:
    """The remote split as the writer makes it (its offsets file too), but only its first and last shards
    exist: a reader that fetched any other shard, or the offsets file, would fail or be seen."""
    folder.mkdir(parents=True)
    count = N // REMOTE_SHARDS
    shards = [{"name": f"train-{k:06d}.tar", "samples": count, "bytes": count * SAMPLE_BYTES + END_OF_ARCHIVE,
               "sha256": "0" * 64} for k in range(REMOTE_SHARDS)]
    for k in (0, REMOTE_SHARDS - 1):
        shard = ShardFile(folder, "train", k)
        for i in range(k * count, (k + 1) * count):
            shard.add_record(i, record(i))
        shards[k] = shard.finish()
        assert shards[k]["bytes"] == count * SAMPLE_BYTES + END_OF_ARCHIVE
    name, offsets = offsets_file("train", [np.arange(count, dtype=np.int64) * SAMPLE_BYTES] * REMOTE_SHARDS)
    (folder / name).write_bytes(offsets)
    info = SplitInfo(samples=N, bytes=N * len(record(0).data), shards=shards,
                     index={"name": name, "bytes": len(offsets), "sha256": hashlib.sha256(offsets).hexdigest()})
    write_dir_manifest(folder, Manifest("wds", CLASSES, {"train": info}))
    return folder


@pytest.fixture
def served(tmp_path, monkeypatch):
    """(URL, paths requested) of the remote split on a loopback HTTP server; the shard cache in tmp_path."""
    write_remote_wds(tmp_path / "www" / "big.wds")
    requested: list[str] = []

    class Recording(RangeHandler):
        def send_head(self):
            requested.append(self.path)
            return super().send_head()

    server = serve(http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), lambda *a, **k: Recording(*a, directory=str(tmp_path / "www"), **k)))
    isolated_cache(monkeypatch, tmp_path)
    yield f"http://127.0.0.1:{server.server_address[1]}/big.wds", requested
    stop_serving(server)


def test_a_remote_wds_opens_and_reads_without_its_offsets_file_in_a_byte_a_record(served):
    url, requested = served
    count = N // REMOTE_SHARDS
    shard_batch = [*range(BATCH), N - 1]  # what a shard-wise first batch reads (one shard), and the end
    open_dataset(url)[N - 1]  # the shards read are downloaded (and the reading modules warmed) outside the measure
    tracemalloc.start()
    try:
        ds = open_dataset(url)
        labels = [ds[i].label for i in shard_batch]
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(ds) == N and labels == [record(i).label for i in shard_batch]
    assert held / N <= 1, f"{held / N:.1f} bytes a record held after the open and the reads"
    sent = pickle.dumps(ds)
    assert len(sent) / N <= 1, f"a worker is sent {len(sent) / N:.1f} bytes a record"
    worker = pickle.loads(sent)
    assert worker.index.span(N - 1) == (REMOTE_SHARDS - 1, (count - 1) * SAMPLE_BYTES, count * SAMPLE_BYTES)
    assert worker.record(N - 1) == record(N - 1) and worker.record(0) == record(0)
    assert not [path for path in requested if "offsets" in path], "the offsets file was fetched"
