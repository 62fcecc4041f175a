"""Opening a `.wds` split of many shards: the shards listed in the manifest (version 2, what the code
before the shard table writes and reads) against the shard table (`{split}.shards.bin`, version 3), from
a local disk and over HTTP, in a fresh process each run, this checkout against another (`--code`).

    python tools/shard_table_bench.py --shards 20000,400000 --code /path/to/other/checkout \
        [--repeats 3] [--json FILE] [--out /tmp/stb]

Datasets (built once under --out, reused): `--shards` shards of 5,000 records (400,000 shards: 2
billion records). Only shard 0 exists (all its 5,000 samples, tools/sparse_datasets.py's synthetic
records, ~20 MB): the first batch reads it, nothing reads another. Every other shard is an entry in the
manifest or the table (its name, samples, bytes, a placeholder sha256) and no file. The offsets file
(8 bytes a record: 16 GB at 2 billion) is sparse, real for shard 0, its sha256 a placeholder (a local
open maps it and checks its header, a remote one never fetches it). Each shard count is built twice,
`listed` and `table`, the same entries.

Runs, per shard count and place (`local`: the folder; `remote`: http://127.0.0.1 by
tests/storage/conftest.py's RangeHandler, an empty cache each run), interleaved `--repeats` times:
`before` (the other checkout, listed), `table` (this one, table), `listed` (this one reading the listed
dataset: datasets written before the table). Each run is a fresh process (imports not counted) timing
  open        open_dataset(path or URL); the resident memory it added (RSS after minus before);
  pickled     len(pickle.dumps(dataset)): what a spawned DataLoader or DALI worker is sent;
  batch       dataset[i] for i in range(256) (shard 0: its download and check when remote), keys checked;
  sizes       dataset.shard_sizes() (what a shard-wise loader's order needs: the table's whole first column).
One more run per code and place traces the open's peak allocation (tracemalloc; not timed). Prints a
Markdown table of medians; --json keeps every run.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import remote_open_bench  # noqa: E402  (its HTTP server on 127.0.0.1)
import sparse_datasets  # noqa: E402

SHARD = 5_000  # records a shard
BATCH = 256
PLACEHOLDER = "0" * 64
CHILD = r"""
import json, os, pickle, sys, time, tracemalloc
target, cache, batch, trace = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "trace"
import datapipe, obstore.store  # imports not counted (obstore's is lazy in datapipe)
from datapipe import open_dataset
rss = lambda: int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")  # resident now
if trace:
    tracemalloc.start()
r0, t0 = rss(), time.perf_counter()
ds = open_dataset(target, cache_dir=cache)
t1, r1 = time.perf_counter(), rss()
out = {"open_s": t1 - t0, "rss_growth": r1 - r0, "records": len(ds), "module": datapipe.__file__}
if trace:
    out = {"traced_peak": tracemalloc.get_traced_memory()[1], "module": datapipe.__file__}
else:
    out["pickled"] = len(pickle.dumps(ds))
    t2 = time.perf_counter()
    out["keys"] = [ds[i].key for i in range(batch)]
    t3 = time.perf_counter()
    sizes = ds.shard_sizes()
    t4 = time.perf_counter()
    out.update(batch_s=t3 - t2, sizes_s=t4 - t3, shards=len(sizes), rss_after=rss())
print(json.dumps(out))
"""


def shard_zero(out: Path) -> tuple[Path, int, str]:
    """Shard 0's file (built once), the bytes of one sample in it, its sha256."""
    from datapipe.formats.tar import END_OF_ARCHIVE
    from datapipe.storage.verify import sha256_file

    path = out / "shard0.tar"
    blob, size = sparse_datasets._wds_samples(out, list(range(SHARD)))
    if not path.exists() or path.stat().st_size != len(blob) + END_OF_ARCHIVE:
        path.write_bytes(blob + bytes(END_OF_ARCHIVE))
    return path, size, sha256_file(path)


def build(folder: Path, shards: int, layout: str, out: Path) -> float:
    """The dataset of `shards` shards at folder, `listed` or `table` (see the docstring); seconds."""
    import numpy as np

    from datapipe.formats.base import write_dir_manifest
    from datapipe.formats.shard_table import table_file
    from datapipe.formats.tar import END_OF_ARCHIVE
    from datapipe.formats.wds_index import offsets_name, shard_name
    from datapipe.records import TABLE_VERSION, Manifest, SplitInfo

    start, building = time.perf_counter(), folder.with_name(folder.name + ".building")
    shutil.rmtree(building, ignore_errors=True)
    building.mkdir(parents=True)
    zero, size, digest = shard_zero(out)
    os.link(zero, building / shard_name("train", 0))
    n = shards * SHARD
    entries = [{"name": shard_name("train", k), "samples": SHARD, "bytes": SHARD * size + END_OF_ARCHIVE,
                "sha256": digest if k == 0 else PLACEHOLDER} for k in range(shards)]
    offsets = np.lib.format.open_memmap(building / offsets_name("train"), mode="w+", dtype="<i8", shape=(n,))
    offsets[:SHARD] = np.arange(SHARD, dtype=np.int64) * size  # the rest: a hole, never read
    offsets.flush()
    del offsets
    index = {"name": offsets_name("train"), "bytes": (building / offsets_name("train")).stat().st_size,
             "sha256": PLACEHOLDER}
    info = SplitInfo(samples=n, bytes=n * len(sparse_datasets.JPEG + b"1234"), index=index)
    if layout == "table":
        name, blob, info.table = table_file("train", entries)
        (building / name).write_bytes(blob)
    else:
        info.shards = entries
    version = TABLE_VERSION if layout == "table" else 2
    write_dir_manifest(building, Manifest("wds", sparse_datasets.CLASSES, {"train": info}, version=version))
    os.replace(building, folder)
    return time.perf_counter() - start


def run_once(code: Path, target: str, scratch: Path, trace: bool) -> dict:
    """One fresh process importing datapipe from `code`, its cache (and TMPDIR) empty."""
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True, mode=0o700)
    env = {**os.environ, "PYTHONPATH": str(code), "TMPDIR": str(scratch)}
    try:
        proc = subprocess.run([sys.executable, "-c", CHILD, target, str(scratch / "cache"), str(BATCH),
                               "trace" if trace else "time"], env=env, cwd=code, capture_output=True, text=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if proc.returncode:
        raise RuntimeError(f"{code} on {target}: the run failed: {proc.stderr.strip().splitlines()[-3:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    if not Path(result.pop("module")).resolve().is_relative_to(code.resolve()):
        raise RuntimeError(f"the run meant for {code} imported datapipe from elsewhere")
    return result


def measure(shards: int, targets: dict[str, tuple[Path, str]], repeats: int, scratch: Path) -> dict[str, dict]:
    """Each run's figures, interleaved over the runs of `targets` (name -> (code, path or URL))."""
    want = [sparse_datasets.record(i).key for i in range(BATCH)]
    runs: dict[str, dict] = {name: {"runs": []} for name in targets}
    for _ in range(repeats):
        for name, (code, target) in targets.items():
            result = run_once(code, target, scratch, trace=False)
            if result.pop("keys") != want or result["records"] != shards * SHARD or result["shards"] != shards:
                raise RuntimeError(f"{name} read other records than the dataset's first batch at {shards} shards")
            runs[name]["runs"].append(result)
    for name, (code, target) in targets.items():
        runs[name]["traced_peak"] = run_once(code, target, scratch, trace=True)["traced_peak"]
    return runs


def row(shards: int, place: str, name: str, got: dict) -> dict:
    med = {k: statistics.median(r[k] for r in got["runs"]) for k in ("open_s", "rss_growth", "pickled", "batch_s",
                                                                      "sizes_s")}
    print(f"| {shards:,} | {place} | {name} | {med['open_s']:.3f} | {med['rss_growth'] / 2**20:.1f} | "
          f"{got['traced_peak'] / 2**20:.2f} | {med['pickled']:,} | {med['batch_s']:.3f} | {med['sizes_s']:.3f} |",
          flush=True)
    return {"shards": shards, "records": shards * SHARD, "place": place, "code": name, **med,
            "traced_peak": got["traced_peak"], "runs": got["runs"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shards", default="20000,400000", help="one count or several, comma-separated")
    parser.add_argument("--code", type=Path, required=True, help="the checkout before the shard table")
    parser.add_argument("--places", default="local,remote")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--out", type=Path, default=Path("/tmp/stb"))
    args = parser.parse_args()
    from datapipe.records import MANIFEST_NAME

    args.out.mkdir(parents=True, exist_ok=True)
    scratch = args.out.with_name(args.out.name + "-scratch")
    before = args.code.resolve()
    summary: list[dict] = []
    print("| shards | place | code | open s | RSS added by the open MiB | open traced peak MiB | pickled bytes | "
          "first batch s | shard_sizes s |\n|---|---|---|---|---|---|---|---|---|", flush=True)
    with remote_open_bench.http_server(args.out) as base:
        for shards in (int(s) for s in args.shards.split(",")):
            folders = {layout: args.out / f"shards-{shards}-{layout}.wds" for layout in ("listed", "table")}
            for layout, folder in folders.items():
                if not (folder / MANIFEST_NAME).exists():
                    print(f"built {folder} in {build(folder, shards, layout, args.out):.1f} s", file=sys.stderr)
            for place in args.places.split(","):
                where = {k: str(f) if place == "local" else f"{base}/{f.name}" for k, f in folders.items()}
                targets = {"before": (before, where["listed"]), "table": (ROOT, where["table"]),
                           "listed": (ROOT, where["listed"])}
                for name, got in measure(shards, targets, args.repeats, scratch).items():
                    summary.append(row(shards, place, name, got))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
