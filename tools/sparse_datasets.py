"""Datasets of up to 100M records for index benchmarks, in each format's real layout but sparse: the
per-record index (offsets, labels) is written whole, real samples only at the records a benchmark
reads (`readable`), the rest is a hole in the file (or an unwritten HDF5 row). Opening, ordering an
epoch and reading those records then cost what they cost on a full dataset of that size.

    from sparse_datasets import build_sparse, readable
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

BATCH, SEED, EPOCH = 256, 0, 0  # the first batch a benchmark builds: EpochOrder(n, BATCH, seed=SEED), epoch EPOCH
SHARD_SAMPLES = 1_000_000
CHUNK = 5_000_000  # index entries written at once
JPEG = bytes.fromhex("ffd8ffe000104a46494600010100000100010000ffd9")  # bytes only: nothing decodes them
CLASSES = [f"c{k:04d}" for k in range(1000)]


def record(i: int):
    from datapipe.records import Record, record_digest

    key, label, data = f"n{i % 1000:05d}_{i:09d}", i % 1000, JPEG + i.to_bytes(4, "little")
    return Record(key, data, label, f"c{label}/{key}.jpg", record_digest(key, label, data))


def readable(n: int, reads: int) -> np.ndarray:
    """The records a benchmark reads at random (the same in every process): real in a sparse dataset."""
    return np.random.default_rng(0).integers(0, n, reads)


def real_records(n: int, reads: int) -> list[int]:
    from datapipe.order.sharding import EpochOrder

    first = EpochOrder(n, BATCH, seed=SEED).batches(EPOCH)[0]
    return sorted({0, n - 1, *first.tolist(), *readable(n, reads).tolist()})


def build_sparse(fmt: str, dst: Path, n: int, reads: int) -> float:
    """Build a sparse `fmt` ("wds" or "hdf5") dataset of n records at dst; returns seconds."""
    start = time.perf_counter()
    {"wds": _sparse_wds, "hdf5": _sparse_hdf5}[fmt](dst, n, real_records(n, reads))
    return time.perf_counter() - start


def _wds_samples(folder: Path, indices: list[int]) -> tuple[bytes, int]:
    """The writer's bytes of these records' samples, end to end, and the size of one (all equal)."""
    from datapipe.formats.wds import ShardFile

    scratch = ShardFile(folder, "scratch", 0)
    for i in indices:
        scratch.add_record(i, record(i))
    scratch.file.close()
    blob = scratch.path.read_bytes()
    scratch.path.unlink()
    size = len(blob) // len(indices)
    if size * len(indices) != len(blob):
        raise RuntimeError("the samples differ in size; make the synthetic records' metadata equal in length")
    return blob, size


def _sparse_wds(dst: Path, n: int, real: list[int]) -> None:
    from datapipe.storage.verify import sha256_file
    from datapipe.formats.base import write_dir_manifest
    from datapipe.formats.tar import END_OF_ARCHIVE
    from datapipe.formats.wds_index import offsets_name, shard_name
    from datapipe.records import Manifest, SplitInfo

    dst.mkdir(parents=True)
    blob, size = _wds_samples(dst, real)
    where = {i: k for k, i in enumerate(real)}
    shards = []
    for number, first in enumerate(range(0, n, SHARD_SAMPLES)):
        count = min(SHARD_SAMPLES, n - first)
        shard = {"name": shard_name("train", number), "samples": count, "bytes": count * size + END_OF_ARCHIVE,
                 "sha256": "0" * 64}
        with open(dst / shard["name"], "wb") as fh:
            fh.truncate(shard["bytes"])
            for i in (i for i in real if first <= i < first + count):
                fh.seek((i - first) * size)
                fh.write(blob[where[i] * size:(where[i] + 1) * size])
        shards.append(shard)
    name = offsets_name("train")
    offsets = np.lib.format.open_memmap(dst / name, mode="w+", dtype="<i8", shape=(n,))
    for a in range(0, n, CHUNK):
        b = min(a + CHUNK, n)
        offsets[a:b] = (np.arange(a, b, dtype=np.int64) % SHARD_SAMPLES) * size
    offsets.flush()
    del offsets
    index = {"name": name, "bytes": (dst / name).stat().st_size, "sha256": sha256_file(dst / name)}
    info = SplitInfo(samples=n, bytes=n * len(JPEG + b"1234"), shards=shards, index=index)
    write_dir_manifest(dst, Manifest("wds", CLASSES, {"train": info}))


def _sparse_hdf5(dst: Path, n: int, real: list[int]) -> None:
    import h5py

    from datapipe.formats.hdf5 import MANIFEST_ATTR, _SplitBuilder
    from datapipe.records import Manifest, SplitInfo

    size = len(JPEG) + 4
    info = SplitInfo(samples=n, bytes=n * size)
    with h5py.File(dst, "w") as f:
        g = _SplitBuilder(f, "train", info).group
        for a in range(0, n, CHUNK):
            b = min(a + CHUNK, n)
            g["offsets"][a + 1:b + 1] = np.arange(a + 1, b + 1, dtype=np.int64) * size
            g["labels"][a:b] = np.arange(a, b, dtype=np.int64) % 1000
        for i in real:
            r = record(i)
            g["blob"][i * size:(i + 1) * size] = np.frombuffer(r.data, np.uint8)
            g["keys"][i], g["paths"][i], g["sha256"][i] = r.key, r.path, r.sha256.encode()
        f.attrs[MANIFEST_ATTR] = Manifest("hdf5", CLASSES, {"train": info}).to_json()
