"""Interleaved A/B of one loader under two settings, with the CPU each process spends per image.

    python tools/ab_loader.py build/bench.lmdb --b-env DATAPIPE_REGION_DECODE=0 [--runs 6]
    python tools/ab_loader.py build/bench.lmdb --b-workers 4
    python tools/ab_loader.py build/bench_sample --b-backend prefetch

A is the default; B differs by environment variables (--b-env, repeatable), the worker count and/or
the backend.
Each run is a fresh process (environment read at import, workers forked anew) that measures
--epochs epochs after a warm-up one, with `datapipe bench`'s timing window; runs alternate A, B,
A, B... so drift on a shared machine hits both alike. Prints the medians, B / A, and the CPU
milliseconds per image of the main process and of the workers (from /proc, Linux).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import torch

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU of one process, from /proc/PID/stat (0 once it has exited)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICKS


def children() -> list[int]:
    me = os.getpid()
    return [int(p) for p in Path(f"/proc/{me}/task/{me}/children").read_text().split()]


def measure(args: argparse.Namespace) -> dict[str, float]:
    """One run in this process: median images/s over epochs 1..E, CPU ms per image per side."""
    from datapipe import make_loader
    from datapipe.bench.suites import BenchOptions, timed

    loader = make_loader(args.data, backend=args.backend, batch_size=args.batch_size,
                         image_size=args.image_size, num_workers=args.workers, max_bad_fraction=1.0)

    def epoch_batches(epoch: int):
        loader.set_epoch(epoch)
        return loader

    run = timed(epoch_batches, lambda b: len(b.images), BenchOptions(seconds=1e9, warmup=2), torch.device("cpu"),
                step=False)
    run(0)  # worker start and first-touch IO
    workers = children()
    main0, workers0 = cpu_seconds(os.getpid()), sum(map(cpu_seconds, workers))
    rates = [run(epoch)[0] for epoch in range(1, args.epochs + 1)]
    images = args.epochs * len(loader.dataset)  # every epoch runs to its end
    return {"images_per_s": statistics.median(rates),
            "main_ms_per_image": (cpu_seconds(os.getpid()) - main0) / images * 1e3,
            "workers_ms_per_image": (sum(map(cpu_seconds, workers)) - workers0) / images * 1e3}


def child_command(args: argparse.Namespace, backend: str, workers: int | None) -> list[str]:
    cmd = [sys.executable, __file__, str(args.data), "--child", "--backend", backend, "--epochs",
           str(args.epochs), "--batch-size", str(args.batch_size), "--image-size", str(args.image_size)]
    return cmd + (["--workers", str(workers)] if workers is not None else [])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("data", type=Path)
    p.add_argument("--backend", default="dataloader")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--epochs", type=int, default=3, help="timed epochs per run")
    p.add_argument("--runs", type=int, default=6, help="runs of each side")
    p.add_argument("--workers", type=int, default=None, help="A's workers (default: cores)")
    p.add_argument("--b-workers", type=int, default=None, help="B's workers (default: A's)")
    p.add_argument("--b-backend", default=None, help="B's backend (default: A's)")
    p.add_argument("--b-env", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(measure(args)))
        return
    b_env = dict(item.split("=", 1) for item in args.b_env)
    sides = {"A": (dict(os.environ), args.backend, args.workers),
             "B": ({**os.environ, **b_env}, args.b_backend or args.backend,
                   args.b_workers if args.b_workers is not None else args.workers)}
    results: dict[str, list[dict[str, float]]] = {"A": [], "B": []}
    for run in range(args.runs):
        for side, (env, backend, workers) in sides.items():
            done = subprocess.run(child_command(args, backend, workers), env=env, capture_output=True, text=True)
            if done.returncode:
                sys.exit(f"run {run + 1} of {side} failed:\n{done.stderr[-2000:]}")
            results[side].append(json.loads(done.stdout.splitlines()[-1]))
    print(" | ".join(f"{side}: {backend}, workers={workers or 'cores'}" for side, (_, backend, workers) in sides.items())
          + (" " + " ".join(args.b_env) if args.b_env else ""))
    medians = {}
    for side, rows in results.items():
        medians[side] = {key: statistics.median(r[key] for r in rows) for key in rows[0]}
        runs = ", ".join(f"{r['images_per_s']:.0f}" for r in rows)
        m = medians[side]
        print(f"{side}: {m['images_per_s']:.0f} img/s (runs: {runs}); CPU per image: main "
              f"{m['main_ms_per_image']:.2f} ms, workers {m['workers_ms_per_image']:.2f} ms")
    print(f"B / A: {medians['B']['images_per_s'] / medians['A']['images_per_s']:.3f}")


if __name__ == "__main__":
    main()
