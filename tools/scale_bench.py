"""ImageNet-scale index benchmark: a synthetic dataset of N tiny JPEGs (1,281,167 by default) in
each format, then, per format, in a fresh process: open time, index memory per process and per
forked worker, open descriptors, random-read records/s.

    python tools/scale_bench.py --out build/scale [--records 1281167] [--formats wds,lmdb,hdf5]
    python tools/scale_bench.py --sparse --records 1000000,10000000,100000000 --formats wds,hdf5 \
        [--code /path/to/another/checkout] --json benchmarks/index-memory.json

Datasets are built once (straight through the format writers: the converter's speed is measured
elsewhere) and reused; `--rebuild` makes them again. `--sparse` builds them in their real layout with
only the per-record index written whole (offsets, labels) and real samples only where the benchmark
reads (sparse_datasets.py): 100M records in minutes and a few GB. `--code DIR` measures the datapipe
checked out in DIR (the same datasets). Prints one table; `--json FILE` keeps it.
"""
from __future__ import annotations

import argparse
import io
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sparse_datasets import BATCH, EPOCH, SEED, build_sparse, readable  # noqa: E402

SUFFIX = {"wds": ".wds", "lmdb": ".lmdb", "hdf5": ".h5"}


def tiny_jpegs(count: int = 16) -> list[bytes]:
    from PIL import Image

    out = []
    for k in range(count):
        buf = io.BytesIO()
        Image.new("RGB", (16, 12), (k * 15 % 256, 80, 200 - k * 9)).save(buf, "JPEG", quality=80)
        out.append(buf.getvalue())
    return out


def build(fmt: str, dst: Path, records: int) -> float:
    """Write `records` tiny records into a `fmt` dataset at dst; returns seconds."""
    from converters.staging import publish
    from datapipe.formats import FORMATS, staging_path
    from datapipe.records import Manifest, Record, SplitInfo, record_digest
    from tqdm import tqdm

    start = time.perf_counter()
    spec, staging = FORMATS[fmt], staging_path(dst)
    images = tiny_jpegs()
    writer = spec.writer(staging, size_hint=records * 700, shard_bytes=256 << 20)
    info = SplitInfo()
    for i in tqdm(range(records), desc=f"build {fmt}", unit="rec", mininterval=2):
        key, label, data = f"n{i % 1000:05d}_{i:08d}", i % 1000, images[i % len(images)]
        record = Record(key, data, label, f"c{label}/{key}.jpg", record_digest(key, label, data))
        writer.write("train", i, record)
        info.add(record)
    writer.close(Manifest(fmt, [f"c{k:04d}" for k in range(1000)], {"train": info}))
    publish(writer.payload, staging, dst)
    return time.perf_counter() - start


def private_kb(pid: int | str = "self") -> int:
    """Memory this process alone holds, kB: its dirty private pages (heap, copy-on-write copies).
    Clean file pages (a memory-mapped index or LMDB file) are the page cache, shared by every process."""
    fields = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()
    return sum(int(l.split()[1]) for l in fields if l.startswith("Private_Dirty"))


def _worker(indices: np.ndarray, queue) -> None:
    """A forked worker: random reads through the parent's dataset, then its own memory."""
    ds = _DATASET
    for i in indices:
        ds[int(i)]
    queue.put(private_kb())


_DATASET = None


def measure(path: Path, reads: int) -> dict:
    """Run in a fresh process: everything about one dataset."""
    global _DATASET
    import pickle

    import datapipe.formats as formats  # imported before the baseline
    from datapipe.order.sharding import EpochOrder

    base_private, base_fds = private_kb(), len(os.listdir("/proc/self/fd"))
    start = time.perf_counter()
    ds = formats.open_dataset(path)
    open_s = time.perf_counter() - start
    ds[0]
    first_read_s = time.perf_counter() - start
    order = readable(len(ds), reads)
    start = time.perf_counter()  # the epoch's first batch: its order, then BATCH records (readable ones: a sparse
    first = EpochOrder(len(ds), BATCH, seed=SEED).batches(EPOCH)[0]  # dataset holds only those, and each
    batch = [ds[int(i)] for i in order[:BATCH]]  # checkout's order picks other records)
    epoch_start_s = time.perf_counter() - start
    opened_private = private_kb()
    pickled = len(pickle.dumps(ds))  # what a spawned worker (or a DALI source worker) is sent
    start = time.perf_counter()
    for i in order:
        ds[int(i)]
    read_rate = reads / (time.perf_counter() - start)
    fds = len(os.listdir("/proc/self/fd")) - base_fds
    _DATASET = ds
    ctx, queue = mp.get_context("fork"), mp.get_context("fork").Queue()
    workers = [ctx.Process(target=_worker, args=(order, queue)) for _ in range(2)]
    for w in workers:
        w.start()
    worker_private = [queue.get() for _ in workers]
    for w in workers:
        w.join()
    assert len(batch) == len(first) == BATCH
    return {"records": len(ds), "open_s": open_s, "first_read_s": first_read_s, "epoch_start_s": epoch_start_s,
            "pickled_b_per_record": pickled / len(ds), "index_kb_per_process": opened_private - base_private,
            "private_kb_per_worker": statistics.median(worker_private), "open_fds": fds,
            "random_reads_per_s": read_rate, "bytes_per_record": 1024 * (opened_private - base_private) / len(ds)}


def dataset(fmt: str, args: argparse.Namespace, records: int) -> tuple[Path, float | None]:
    """The `fmt` dataset of `records` records under args.out (built unless there); seconds it took."""
    dst = args.out / f"{'sparse' if args.sparse else 'scale'}-{records}{SUFFIX[fmt]}"
    if args.rebuild and dst.exists():
        import shutil
        (shutil.rmtree if dst.is_dir() else os.remove)(dst)
    if dst.exists():
        return dst, None
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.sparse:
        return dst, build(fmt, dst, records)
    building = dst.with_name(dst.name + ".building")  # a build cut short is never taken for a dataset
    if building.exists():
        import shutil
        (shutil.rmtree if building.is_dir() else os.remove)(building)
    seconds = build_sparse(fmt, building, records, args.reads)
    os.replace(building, dst)
    os.sync()  # written back: a mapped page still dirty in the page cache would count as a reader's private memory
    return dst, seconds


def measure_in(code: Path, dst: Path, reads: int) -> dict:
    """measure(dst) in a fresh process importing datapipe from the checkout `code`."""
    env = {**os.environ, "SCALE_BENCH_CODE": str(code)}
    out = subprocess.run([sys.executable, __file__, "--measure", str(dst), "--reads", str(reads)], env=env,
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("build/scale"))
    parser.add_argument("--records", default="1281167", help="one count or several, comma-separated")
    parser.add_argument("--formats", default="wds,lmdb,hdf5")
    parser.add_argument("--reads", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rebuild", action="store_true")
    parser.add_argument("--sparse", action="store_true", help="sparse datasets (wds, hdf5): see sparse_datasets.py")
    parser.add_argument("--code", type=Path, default=Path(__file__).resolve().parents[1],
                        help="the checkout whose datapipe is measured (default: this one)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--measure", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure, args.reads)))
        return 0
    print(f"{'format':7} {'records':>11} {'open s':>7} {'epoch s':>8} {'index B/rec':>11} {'sent B/rec':>10} "
          f"{'worker MB':>9} {'fds':>4} {'reads/s':>8}", flush=True)
    summary = {}
    for records in (int(r) for r in args.records.split(",")):
        paths = {fmt: dataset(fmt, args, records) for fmt in args.formats.split(",")}
        runs: dict[str, list[dict]] = {fmt: [] for fmt in paths}
        for _ in range(args.repeats):  # interleaved: drift hits every format alike
            for fmt, (dst, _) in paths.items():
                runs[fmt].append(measure_in(args.code, dst, args.reads))
        for fmt, rows in runs.items():
            med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
            summary[f"{fmt}-{records}"] = {"format": fmt, **med, "runs": rows, "build_s": paths[fmt][1],
                                           "sparse": args.sparse, "code": str(args.code)}
            print(f"{fmt:7} {records:>11} {med['open_s']:>7.3f} {med['epoch_start_s']:>8.3f} "
                  f"{med['bytes_per_record']:>11.2f} {med['pickled_b_per_record']:>10.2f} "
                  f"{med['private_kb_per_worker'] / 1024:>9.1f} {int(med['open_fds']):>4} "
                  f"{med['random_reads_per_s']:>8.0f}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.environ.get("SCALE_BENCH_CODE") or str(Path(__file__).resolve().parents[1]))
    raise SystemExit(main())
