"""Memory of a node: N ranks x W loader workers over a big synthetic dataset, per format, backend and
worker start method. Reports the node's total PSS and, per process, the private bytes each record
costs.

    python tools/node_memory.py --out build/scale [--records 1281167] [--small 20000] [--ranks 2]
        [--workers 2] [--formats wds,lmdb,hdf5,folder] [--backends dataloader,dali]
        [--start-methods fork,spawn] [--json benchmarks/node-memory-cpu.json]

Each rank is a fresh process (as under torchrun) that builds a loader with its rank and the world
size, reads `--batches` batches, then measures itself and every process below it from
/proc/PID/smaps_rollup: PSS (shared pages split between their users) and private bytes (dirty pages
only that process holds: its heap and copy-on-write copies; clean file pages, a memory-mapped index
or LMDB file, are the page cache, which the kernel can drop and every process shares). Private memory per record is the difference
between the same run over the big dataset and over a small one (`--small` records), divided by the
difference in records: what the index costs each process, with torch's own footprint cancelled.
The datasets are built once with tools/scale_bench.py's writer (tiny JPEGs) and reused.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scale_bench import SUFFIX, build, tiny_jpegs  # noqa: E402

SUFFIX = {**SUFFIX, "folder": ""}
TIMEOUT_S = 600


def memory(pid: int | str) -> dict[str, int]:
    """PSS and private bytes of one process."""
    fields = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        name, value = line.split(":", 1)
        fields[name] = int(value.split()[0]) * 1024
    return {"pss": fields["Pss"], "private": fields["Private_Dirty"]}  # clean file pages are the page cache


def descendants(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            found += [int(child), *descendants(int(child))]
    return found


def run_rank(path: str, rank: int, world: int, backend: str, workers: int, start_method: str, batches: int) -> None:
    """One rank: read `batches` batches, then print the memory of this process and its workers."""
    import datapipe

    loader = datapipe.make_loader(path, backend=backend, rank=rank, world_size=world, num_workers=workers,
                                  start_method=start_method, batch_size=64, image_size=16, device="cpu")
    for n, _ in enumerate(loader):
        if n + 1 >= batches:
            break
    processes, children = {"rank": memory("self")}, descendants(os.getpid())
    for k, child in enumerate(children):
        try:
            processes[f"child{k}"] = memory(child)
        except (FileNotFoundError, ProcessLookupError):
            continue
    print(json.dumps({"records": len(loader.dataset), "processes": processes}))
    sys.stdout.flush()
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # torch's handler would raise as its workers die
    for child in children:  # measured: end the workers (DALI's outlive their parent and hold our stdout)
        try:
            os.kill(child, signal.SIGKILL)
        except ProcessLookupError:
            pass
    os._exit(0)


def run_node(path: Path, args: argparse.Namespace, backend: str, start_method: str) -> list[dict]:
    """Start every rank at once; each one's report."""
    ranks = [subprocess.Popen([sys.executable, __file__, "--rank-run", str(path), str(rank), str(args.ranks), backend,
                               str(args.workers), start_method, str(args.batches)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in range(args.ranks)]
    reports = []
    for p in ranks:
        out, err = p.communicate(timeout=TIMEOUT_S)
        if p.returncode:
            raise SystemExit(f"a rank failed ({path.name}, {backend}, {start_method}): {err.strip()[-2000:]}")
        reports.append(json.loads(out.strip().splitlines()[-1]))
    return reports


def build_folder(dst: Path, records: int) -> None:
    """An ImageNet-layout folder of `records` tiny JPEGs in 1,000 classes."""
    images = tiny_jpegs()
    for i in range(records):
        folder = dst / f"n{i % 1000:08d}"
        if i < 1000:
            folder.mkdir(parents=True, exist_ok=True)
        (folder / f"n{i % 1000:08d}_{i:08d}.JPEG").write_bytes(images[i % len(images)])


def dataset(fmt: str, out: Path, records: int) -> Path:
    dst = out / f"scale-{records}{SUFFIX[fmt]}" if fmt != "folder" else out / f"folder-{records}"
    if not dst.exists():
        out.mkdir(parents=True, exist_ok=True)
        build_folder(dst, records) if fmt == "folder" else build(fmt, dst, records)
    return dst


def summarize(big: list[dict], small: list[dict]) -> dict:
    """Node PSS, and private bytes per record per process (median over processes of one role)."""
    extra = big[0]["records"] - small[0]["records"]
    row = {"node_pss_mb": sum(p["pss"] for r in big for p in r["processes"].values()) / 2**20}
    for role in ("rank", "worker"):
        pick = (lambda name: name == "rank") if role == "rank" else (lambda name: name != "rank")
        grown = [(pb["private"] - ps["private"]) / extra
                 for rb, rs in zip(big, small)
                 for (nb, pb), (ns, ps) in zip(sorted(rb["processes"].items()), sorted(rs["processes"].items()))
                 if pick(nb) and pick(ns)]
        row[f"{role}_private_b_per_record"] = statistics.median(grown) if grown else None
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("build/scale"))
    parser.add_argument("--records", type=int, default=1_281_167)
    parser.add_argument("--small", type=int, default=20_000)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--formats", default="wds,lmdb,hdf5,folder")
    parser.add_argument("--backends", default="dataloader,dali")
    parser.add_argument("--start-methods", default="fork,spawn")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--rank-run", nargs=7, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_run:
        path, rank, world, backend, workers, start, batches = args.rank_run
        run_rank(path, int(rank), int(world), backend, int(workers), start, int(batches))
    rows = []
    print(f"{'format':7} {'backend':10} {'start':6} {'node PSS MB':>11} {'rank B/rec':>10} {'worker B/rec':>12}")
    for fmt in args.formats.split(","):
        big, small = dataset(fmt, args.out, args.records), dataset(fmt, args.out, args.small)
        for backend in args.backends.split(","):
            for start in args.start_methods.split(","):
                row = {"format": fmt, "backend": backend, "start_method": start, "ranks": args.ranks,
                       "workers": args.workers, "records": args.records,
                       **summarize(run_node(big, args, backend, start), run_node(small, args, backend, start))}
                rows.append(row)
                print(f"{fmt:7} {backend:10} {start:6} {row['node_pss_mb']:>11.0f} "
                      f"{row['rank_private_b_per_record']:>10.1f} {row['worker_private_b_per_record']:>12.1f}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    raise SystemExit(main())
