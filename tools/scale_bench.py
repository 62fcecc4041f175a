"""ImageNet-scale index benchmark: a synthetic dataset of N tiny JPEGs (1,281,167 by default) in
each format, then, per format, in a fresh process: open time, index memory per process and per
forked worker, open descriptors, random-read records/s.

    python tools/scale_bench.py --out build/scale [--records 1281167] [--formats wds,lmdb,hdf5]

Datasets are built once (straight through the format writers: the converter's speed is measured
elsewhere) and reused; `--rebuild` makes them again. Prints one table; `--json FILE` keeps it.
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
    import datapipe.formats as formats  # imported before the baseline

    base_private, base_fds = private_kb(), len(os.listdir("/proc/self/fd"))
    start = time.perf_counter()
    ds = formats.open_dataset(path)
    open_s = time.perf_counter() - start
    ds[len(ds) // 2]
    first_read_s = time.perf_counter() - start
    opened_private = private_kb()
    rng = np.random.default_rng(0)
    order = rng.integers(0, len(ds), reads)
    start = time.perf_counter()
    for i in order:
        ds[int(i)]
    read_rate = reads / (time.perf_counter() - start)
    fds = len(os.listdir("/proc/self/fd")) - base_fds
    _DATASET = ds
    ctx, queue = mp.get_context("fork"), mp.get_context("fork").Queue()
    workers = [ctx.Process(target=_worker, args=(rng.integers(0, len(ds), reads), queue)) for _ in range(2)]
    for w in workers:
        w.start()
    worker_private = [queue.get() for _ in workers]
    for w in workers:
        w.join()
    return {"records": len(ds), "open_s": open_s, "first_read_s": first_read_s, "index_kb_per_process": opened_private - base_private,
            "private_kb_per_worker": statistics.median(worker_private), "open_fds": fds,
            "random_reads_per_s": read_rate, "bytes_per_record": 1024 * (opened_private - base_private) / len(ds)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("build/scale"))
    parser.add_argument("--records", type=int, default=1_281_167)
    parser.add_argument("--formats", default="wds,lmdb,hdf5")
    parser.add_argument("--reads", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rebuild", action="store_true")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--measure", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure, args.reads)))
        return 0
    rows, built = {}, {}
    for fmt in args.formats.split(","):
        dst = args.out / f"scale-{args.records}{SUFFIX[fmt]}"
        if args.rebuild or not dst.exists():
            if dst.exists():
                import shutil
                (shutil.rmtree if dst.is_dir() else os.remove)(dst)
            args.out.mkdir(parents=True, exist_ok=True)
            built[fmt] = build(fmt, dst, args.records)
        rows[fmt] = []
    for _ in range(args.repeats):  # interleaved: drift hits every format alike
        for fmt in rows:
            dst = args.out / f"scale-{args.records}{SUFFIX[fmt]}"
            out = subprocess.run([sys.executable, __file__, "--measure", str(dst), "--reads", str(args.reads)],
                                 check=True, capture_output=True, text=True).stdout
            rows[fmt].append(json.loads(out.strip().splitlines()[-1]))
    print(f"{'format':7} {'records':>9} {'open s':>7} {'1st read s':>10} {'index B/rec':>11} {'worker MB':>9} "
          f"{'fds':>4} {'reads/s':>8}")
    summary = {}
    for fmt, runs in rows.items():
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        summary[fmt] = {**med, "runs": runs, "build_s": built.get(fmt)}
        print(f"{fmt:7} {int(med['records']):>9} {med['open_s']:>7.3f} {med['first_read_s']:>10.3f} "
              f"{med['bytes_per_record']:>11.1f} "
              f"{med['private_kb_per_worker'] / 1024:>9.1f} {int(med['open_fds']):>4} {med['random_reads_per_s']:>8.0f}")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    raise SystemExit(main())
