"""backend="ray" against the threads backend on the same cores: the trainer process's CPU per image
and images/s, medians of interleaved runs (one epoch each, after a warm-up epoch), DeiT recipe, uint8
batches (normalization is the same in both). The pool runs on a local Ray on 127.0.0.1 with `--workers`
CPUs; the threads backend gets `--workers` decode threads.

    python tools/bench_ray_pool.py DATASET [--workers 2] [--runs 3] [--batch-size 32] [--out benchmarks/ray-pool-cpu]

CPU per image: time.process_time() of this process (its threads included; not the actors'), per image;
bytes per image: the host batches received from the pool (datapipe.bench.meter, which `datapipe bench
--backend ray` measures with too).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
from pathlib import Path

import ray
import torch

from datapipe import make_loader
from datapipe.bench.meter import epoch_usage


def one_epoch(loader, epoch: int) -> dict:
    return epoch_usage(loader, epoch).as_dict()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("data")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--recipe", default="deit")
    p.add_argument("--out", default="benchmarks/ray-pool-cpu")
    args = p.parse_args()
    logging.getLogger("datapipe").setLevel(logging.WARNING)
    torch.set_num_threads(1)
    ray.init(num_cpus=args.workers, _node_ip_address="127.0.0.1", include_dashboard=False,
             logging_level=logging.WARNING, log_to_driver=False)
    common = dict(batch_size=args.batch_size, image_size=args.image_size, recipe=args.recipe, dtype=torch.uint8)
    loaders = {"threads": make_loader(args.data, backend="threads", num_workers=args.workers, **common),
               "ray": make_loader(args.data, backend="ray", pool_workers=args.workers, **common)}
    for loader in loaders.values():
        one_epoch(loader, 0)  # warm-up: actors up, page cache, Pillow plugins
    runs: dict[str, list[dict]] = {name: [] for name in loaders}
    for r in range(args.runs):  # interleaved: the machine's load falls on both alike
        for name, loader in loaders.items():
            runs[name].append(one_epoch(loader, r + 1))
    med = {name: {k: statistics.median(x[k] for x in rows) for k in ("images_per_s", "trainer_cpu_ms_per_image")}
           for name, rows in runs.items()}
    ratios = {"trainer_cpu_per_image_ray_over_threads": med["ray"]["trainer_cpu_ms_per_image"]
              / med["threads"]["trainer_cpu_ms_per_image"],
              "images_per_s_ray_over_threads": med["ray"]["images_per_s"] / med["threads"]["images_per_s"]}
    doc = {"what": "backend='ray' vs 'threads' on the same cores", "args": vars(args), "cpus": os.cpu_count(),
           "load_avg_at_end": os.getloadavg(), "machine": platform.processor() or platform.machine(),
           "medians": med, "ratios": ratios, "runs": runs, "ray": ray.__version__}
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps(doc, indent=2))
    rows = "\n".join(f"| {n} | {m['images_per_s']:.1f} | {m['trainer_cpu_ms_per_image']:.2f} |" for n, m in med.items())
    out.with_suffix(".md").write_text(
        f"# backend='ray' vs 'threads' ({args.recipe}, {args.image_size} px, batch {args.batch_size}, {args.workers} "
        f"workers, {os.cpu_count()} cores, medians of {args.runs} interleaved epochs)\n\n"
        f"| backend | images/s | trainer CPU ms/image |\n|---|---|---|\n{rows}\n\n"
        f"ray/threads: trainer CPU per image {ratios['trainer_cpu_per_image_ray_over_threads']:.2f}x, images/s "
        f"{ratios['images_per_s_ray_over_threads']:.2f}x. Load average at the end: "
        f"{', '.join(f'{x:.1f}' for x in os.getloadavg())} (a shared machine).\n")
    print(out.with_suffix(".md").read_text())
    ray.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
