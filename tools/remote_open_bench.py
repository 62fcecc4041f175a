"""Opening a remote `.wds` split over HTTP with an empty shard cache: open_dataset(url), then its
first batch, in a fresh process each run, this checkout against another (`--code`).

    python tools/remote_open_bench.py --records 1000000,10000000 [--code /path/to/other/checkout] \
        [--repeats 3] [--json FILE] [--out /tmp/rob/data]

Datasets (built once under --out, reused): N records in shards of 5,000, tools/sparse_datasets.py's
sparse `.wds` layout (its `_sparse_wds`, SHARD_SAMPLES set to 5,000 for the call). Only shard 0 is
real (all its 5,000 samples, so its tar headers can be walked, ~4 KiB a sample: ~20 MB); the others
are holes of their full size (zeros), never read. Every shard's manifest entry has its name, samples,
bytes and the true sha256 of its bytes (zeros of one size share one digest: one hash each size).
`train.offsets.npy` (8 B a record) and its manifest `index` entry are written whole, so code that
fetched it at open (before 6b23036) opens the same dataset.

The datasets' parent folder is served on 127.0.0.1 (port 0) by tests/storage/conftest.py's
RangeHandler. Per N, per code, `--repeats` times interleaved (N new, N old, N new, ...), a fresh
process (PYTHONPATH at that checkout; TMPDIR and cache_dir= a new empty folder) times:
  open         open_dataset(url): the manifest, and the offsets file where the code fetches it;
  first batch  dataset[i] for i in range(256): the first 256 records of shard 0 (its download and
               sha256 check; the new code also walks its 5,000 tar headers). Keys are checked.
The imports of datapipe and obstore are not counted. Prints medians (and of open + first batch);
--json keeps every run.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import http.server
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "storage"))
sys.path.insert(0, str(ROOT / "tools"))
import sparse_datasets  # noqa: E402
from conftest import RangeHandler, serve, stop_serving  # noqa: E402

SHARD = 5_000  # records a shard
BATCH = 256  # the first batch: records 0 .. BATCH-1, all in shard 0
CHILD = r"""
import json, sys, time
url, cache, batch = sys.argv[1], sys.argv[2], int(sys.argv[3])
import datapipe, obstore.store  # imports not counted (obstore's is lazy in datapipe)
from datapipe import open_dataset
t0 = time.perf_counter()
ds = open_dataset(url, cache_dir=cache)
t1 = time.perf_counter()
keys = [ds[i].key for i in range(batch)]
t2 = time.perf_counter()
print(json.dumps({"open_s": t1 - t0, "batch_s": t2 - t1, "records": len(ds), "keys": keys,
                  "module": datapipe.__file__}))
"""


@functools.cache
def zeros_sha256(size: int) -> str:
    digest, chunk = hashlib.sha256(), bytes(1 << 20)
    for start in range(0, size, len(chunk)):
        digest.update(chunk[: min(len(chunk), size - start)])
    return digest.hexdigest()


def expected_keys(n: int) -> list[str]:
    return [sparse_datasets.record(i).key for i in range(min(BATCH, n))]


def build(folder: Path, n: int) -> float:
    """The sparse dataset of n records at folder (see the docstring), checked by a local open; seconds."""
    from datapipe import open_dataset
    from datapipe.formats.base import read_dir_manifest, write_dir_manifest
    from datapipe.storage.verify import sha256_file

    start, building = time.perf_counter(), folder.with_name(folder.name + ".building")
    shutil.rmtree(building, ignore_errors=True)  # a build cut short is never taken for a dataset
    saved, sparse_datasets.SHARD_SAMPLES = sparse_datasets.SHARD_SAMPLES, SHARD
    try:
        sparse_datasets._sparse_wds(building, n, list(range(min(SHARD, n))))  # shard 0 whole, the rest holes
    finally:
        sparse_datasets.SHARD_SAMPLES = saved
    manifest = read_dir_manifest(building)  # the builder's placeholder digests -> the files' true ones
    for k, shard in enumerate(manifest.split("train").shards):
        shard["sha256"] = sha256_file(building / shard["name"]) if k == 0 else zeros_sha256(shard["bytes"])
    write_dir_manifest(building, manifest)
    ds = open_dataset(building)
    if len(ds) != n or [ds[i].key for i in range(min(BATCH, n))] != expected_keys(n):
        raise RuntimeError(f"{building}: the built dataset does not read back ({len(ds)} records)")
    os.replace(building, folder)
    return time.perf_counter() - start


def run_once(code: Path, url: str, scratch: Path) -> dict:
    """One fresh process importing datapipe from `code`, its cache (and TMPDIR) empty; its timings."""
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True, mode=0o700)
    env = {**os.environ, "PYTHONPATH": str(code), "TMPDIR": str(scratch)}
    try:
        proc = subprocess.run([sys.executable, "-c", CHILD, url, str(scratch / "cache"), str(BATCH)], env=env,
                              cwd=code, capture_output=True, text=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if proc.returncode:
        raise RuntimeError(f"{code}: the run failed: {proc.stderr.strip().splitlines()[-1:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    if not Path(result.pop("module")).resolve().is_relative_to(code.resolve()):
        raise RuntimeError(f"the run meant for {code} imported datapipe from elsewhere")
    return result


@contextlib.contextmanager
def http_server(folder: Path):
    """A Range-capable HTTP server of `folder` on 127.0.0.1 only; yields its base URL."""
    handler = functools.partial(RangeHandler, directory=str(folder))
    server = serve(http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler))
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        stop_serving(server)


def measure(n: int, url: str, codes: dict[str, Path], repeats: int, scratch: Path) -> dict[str, list[dict]]:
    """Every code's runs at n records, interleaved; each run's keys checked against the dataset's."""
    runs: dict[str, list[dict]] = {name: [] for name in codes}
    for _ in range(repeats):
        for name, code in codes.items():
            result = run_once(code, url, scratch)
            if result.pop("keys") != expected_keys(n) or result["records"] != n:
                raise RuntimeError(f"{name} code read other records than the dataset's first batch at N={n}")
            runs[name].append(result)
    return runs


def report(n: int, runs: dict[str, list[dict]], codes: dict[str, Path], built: float | None) -> list[dict]:
    """Print each code's medians at n records (a table row); return them with every run."""
    rows = []
    for name, got in runs.items():
        med = {k: statistics.median(r[k] for r in got) for k in ("open_s", "batch_s")}
        med["total_s"] = statistics.median(r["open_s"] + r["batch_s"] for r in got)
        rows.append({"records": n, "code": str(codes[name]), **med, "runs": got, "build_s": built})
        print(f"{n:>11} {name:5} {med['open_s']:>7.3f} {med['batch_s']:>8.3f} {med['total_s']:>8.3f}   "
              f"{'reused' if built is None else f'{built:.1f}'}", flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", default="1000000,10000000", help="one count or several, comma-separated")
    parser.add_argument("--code", type=Path, help="another checkout to measure against (e.g. a git worktree)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--out", type=Path, default=Path("/tmp/rob/data"))
    args = parser.parse_args()
    from datapipe.records import MANIFEST_NAME

    codes = {"this": ROOT, **({"other": args.code.resolve()} if args.code else {})}
    args.out.mkdir(parents=True, exist_ok=True)
    scratch = args.out.with_name(args.out.name + "-scratch")  # the runs' caches: outside the folder served
    summary: list[dict] = []
    print(f"{'records':>11} {'code':5} {'open s':>7} {'batch s':>8} {'total s':>8}   build s", flush=True)
    with http_server(args.out) as base:
        for n in (int(r) for r in args.records.split(",")):
            folder = args.out / f"remote-{n}.wds"
            built = None if (folder / MANIFEST_NAME).exists() else build(folder, n)
            summary += report(n, measure(n, f"{base}/{folder.name}", codes, args.repeats, scratch), codes, built)
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
