"""DALI backend images/s at several source worker counts beside the dataloader backend, on one dataset.

    python tools/bench_dali_workers.py build/bench_dali.lmdb [--py-workers 1 2 4] [--rounds 3]
        [--epochs 2] [--read-latency-ms 2] [--code before=/tmp/old-checkout --code after=.]
        [--json benchmarks/dali-workers-cpu.json]

Every run is a fresh process (workers forked anew) that builds one loader, reads a warm-up epoch,
then times --epochs epochs with `datapipe bench`'s timing window (warm-up batches, the epoch's last
DRAIN_BATCHES left out) and reports their median. A round runs every configuration once, in turn
(dataloader, dali at each --py-workers), so drift on a shared machine hits them alike; a
configuration's figure is the median of its rounds.

The DALI backend sizes its source workers from num_workers (half its CPU threads); here its CPU
threads keep their default and only the source's Python worker count (DALI's py_num_workers) is set,
by wrapping the backend's build_pipeline: that works on any version of the backend, so the same
script measures the code before and after a change. --code LABEL=CHECKOUT (repeatable) runs each
configuration with each checkout's datapipe in the same round. --read-latency-ms adds a wait to every
record read, in whichever process reads it, as storage that is not local would. --json merges the
results into the file by label and keeps the other labels'.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path


def measure(args: argparse.Namespace) -> dict:
    """One run in this process: the configuration's median images/s over epochs 1..E."""
    import torch

    import datapipe
    from datapipe import make_loader, open_dataset
    from datapipe.bench.suites import BenchOptions, timed

    info: dict = {"datapipe": str(Path(datapipe.__file__).parent)}
    backend = "dataloader" if args.one == "dataloader" else "dali"
    if backend == "dali":
        import datapipe.backends.dali as dali_backend

        py_workers = int(args.one.removeprefix("dali-py"))
        build = dali_backend.build_pipeline

        def build_with_workers(source, **kwargs):
            pipe = build(source, **{**kwargs, "py_workers": py_workers})
            info.update(dali_threads=kwargs["threads"], py_workers=py_workers)
            return pipe

        dali_backend.build_pipeline = build_with_workers
    dataset = open_dataset(args.data)
    if args.read_latency_ms:  # every record read waits, in whichever process reads it (storage latency)
        read, latency = type(dataset)._read, args.read_latency_ms / 1000

        def slow_read(self, index):
            time.sleep(latency)
            return read(self, index)

        type(dataset)._read = slow_read
    loader = make_loader(dataset, backend=backend, batch_size=args.batch_size, image_size=args.image_size,
                         max_bad_fraction=1.0)

    def epoch_batches(epoch: int):
        loader.set_epoch(epoch)
        return loader

    run = timed(epoch_batches, lambda b: len(b.images), BenchOptions(seconds=1e9, warmup=2), torch.device("cpu"),
                step=False)
    run(0)  # worker start, pipeline build, first-touch IO
    if backend == "dali":  # what DALI really runs: the source's prefetch depth (None before a fix)
        groups = getattr(loader._pipe, "_parallel_input_callbacks", None) or []
        info["source_prefetch_depth"] = getattr(groups[0], "prefetch_queue_depth", None) if groups else None
    else:
        info["workers"] = loader.options.workers
    cpu_before = cpu_seconds()
    rates = [run(epoch)[0] for epoch in range(1, args.epochs + 1)]
    cpu = (cpu_seconds() - cpu_before) / (args.epochs * len(loader.dataset)) * 1e3
    return {"images_per_s": statistics.median(rates), "epochs": [round(r, 1) for r in rates],
            "cpu_ms_per_image": round(cpu, 3), **info}


def cpu_seconds() -> float:
    """User + system CPU of this process (all its threads) and of its live children (the workers),
    from /proc (Linux): what a configuration costs, less sensitive than images/s to a busy machine."""
    ticks, me = os.sysconf("SC_CLK_TCK"), os.getpid()
    total = 0.0
    for pid in [me, *map(int, Path(f"/proc/{me}/task/{me}/children").read_text().split())]:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue
        total += (int(fields[11]) + int(fields[12])) / ticks
    return total


def child(args: argparse.Namespace, config: str, code: str | None) -> dict:
    """One run in a fresh process; `code`: a checkout whose datapipe it imports (PYTHONPATH)."""
    cmd = [sys.executable, __file__, str(args.data), "--one", config, "--epochs", str(args.epochs),
           "--batch-size", str(args.batch_size), "--image-size", str(args.image_size),
           "--read-latency-ms", str(args.read_latency_ms)]
    env = dict(os.environ, PYTHONPATH=code) if code else None
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    if done.returncode:
        sys.exit(f"{config} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.splitlines()[-1])


def git_state(root: Path) -> str:
    """HEAD of the checkout, with '+changes' when its tracked files differ from it."""
    def git(*argv: str) -> str:
        return subprocess.run(["git", "-C", str(root), *argv], capture_output=True, text=True).stdout.strip()

    try:
        head, dirty = git("rev-parse", "--short", "HEAD"), git("status", "--porcelain", "--untracked-files=no")
    except OSError:
        return "unknown"
    return (head or "unknown") + ("+changes" if dirty else "")


def table(runs: dict[str, list[dict]]) -> list[dict]:
    base = statistics.median(r["images_per_s"] for r in runs["dataloader"])
    rows = []
    for config, results in runs.items():
        rate = statistics.median(r["images_per_s"] for r in results)
        extra = {k: v for k, v in results[0].items() if k not in ("images_per_s", "epochs")}
        cpu = statistics.median(r["cpu_ms_per_image"] for r in results)
        rows.append({"config": config, "images_per_s": round(rate, 1), "vs_dataloader": round(rate / base, 3),
                     "cpu_ms_per_image": round(cpu, 3), "runs": [round(r["images_per_s"], 1) for r in results],
                     **{k: v for k, v in extra.items() if k != "cpu_ms_per_image"}})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("data", type=Path, help="a packed dataset or image folder")
    p.add_argument("--py-workers", type=int, nargs="+", default=[1, 2, 4], help="DALI source worker counts")
    p.add_argument("--rounds", type=int, default=3, help="runs of each configuration, interleaved")
    p.add_argument("--epochs", type=int, default=2, help="timed epochs per run")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--read-latency-ms", type=float, default=0.0,
                   help="add this much latency to every record read (storage that is not local)")
    p.add_argument("--code", action="append", default=[], metavar="LABEL=CHECKOUT",
                   help="measure the datapipe of this checkout too (e.g. before=/tmp/old), interleaved with "
                        "the others (default: the one this Python imports, as --label)")
    p.add_argument("--label", default="run", help="name of the result without --code (e.g. after)")
    p.add_argument("--json", type=Path, help="write (merge) the results into this JSON file, one per label")
    p.add_argument("--one", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        print(json.dumps(measure(args)))
        return
    codes = {label: str(Path(code).resolve()) for label, code in (item.split("=", 1) for item in args.code)}
    codes = codes or {args.label: None}
    configs = ["dataloader"] + [f"dali-py{n}" for n in args.py_workers]
    runs = {label: {c: [] for c in configs} for label in codes}
    started = time.time()
    for round_ in range(args.rounds):
        for config in configs:
            for label, code in codes.items():
                runs[label][config].append(child(args, config, code))
                print(f"round {round_ + 1}: {label} {config}: {runs[label][config][-1]['images_per_s']:.0f} img/s",
                      file=sys.stderr)
    tables = {label: table(by_config) for label, by_config in runs.items()}
    for label, rows in tables.items():
        print(f"{label}: read latency {args.read_latency_ms:g} ms\n"
              f"{'config':<12} {'img/s':>8} {'x dataloader':>13} {'CPU ms/img':>11}  runs")
        for row in rows:
            print(f"{row['config']:<12} {row['images_per_s']:>8.0f} {row['vs_dataloader']:>13.2f} "
                  f"{row['cpu_ms_per_image']:>11.2f}  {row['runs']}")
    if args.json:
        from nvidia.dali import __version__ as dali_version
        import torch

        document = json.loads(args.json.read_text()) if args.json.exists() else {}
        document.setdefault("description", __doc__.splitlines()[0])
        for label, rows in tables.items():
            root = Path(codes[label] or Path(__file__).resolve().parents[1])
            document.setdefault("results", {})[label] = {
                "code": git_state(root), "data": str(args.data), "read_latency_ms": args.read_latency_ms,
                "batch_size": args.batch_size, "image_size": args.image_size, "rounds": args.rounds,
                "epochs_per_run": args.epochs, "seconds_all_labels": round(time.time() - started),
                "interleaved_with": sorted(codes), "cpus": len(os.sched_getaffinity(0)),
                "machine": platform.processor() or platform.machine(), "dali": dali_version,
                "torch": torch.__version__, "rows": rows}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(document, indent=1) + "\n")


if __name__ == "__main__":
    main()
