"""`datapipe doctor`: its flags, the checks (datapipe.doctor.pipeline), the GPU self-test (--gpu) and the
cluster section (--ray or RAY_ADDRESS: datapipe.doctor.cluster). Environment reads happen here."""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping


def add_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("doctor", help="check torch, CUDA, DALI, cores, pinned memory, disk and environment")
    p.add_argument("data", nargs="?", help="a dataset path: also check its disk's free space and read speed "
                                           "(with --gpu: the records the self-test reads)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--gpu", action="store_true",
                   help="run the GPU self-test instead: each GPU path against the CPU path on the same records "
                        "(DALI decode, prefetcher, pinned copies, AMP, NCCL); exit status 1 on a mismatch")
    ray = p.add_argument_group("cluster", "a running Ray cluster for backend='ray' and the pool's sizing there "
                                          "(docs/clusters.md); never starts one")
    ray.add_argument("--ray", nargs="?", const="auto", metavar="HOST:PORT",
                     help="describe the Ray cluster at HOST:PORT (alone: RAY_ADDRESS's, else the one `ray start` "
                          "runs on this machine); RAY_ADDRESS set also turns this on")
    ray.add_argument("--images-per-s", type=float, help="the image rate to size for (default: 3,000 per GPU of "
                     "the cluster; a cluster without GPUs has no default: give it)")
    ray.add_argument("--image-size", type=int, default=224, help="the side of the decoded images shipped (default 224)")
    ray.add_argument("--jpeg-kb", type=float, default=110.0, help="mean encoded image size in KB (default 110, ImageNet's)")
    ray.add_argument("--link-gbit", type=float, default=100.0, help="the network link of a GPU node, Gbit/s (default 100)")
    p.set_defaults(run=run_doctor)


def run_gpu_selftest(args: argparse.Namespace) -> int:
    from ..doctor.pipeline import machine_info
    from ..doctor.selftest import document, exit_status, gpu_absent, run_selftest, table

    absent = gpu_absent()
    if absent is not None:
        print(json.dumps({"results": [], "message": absent, "exit_status": 0}) if args.json else absent)
        return 0
    results = run_selftest(args.data, env=os.environ,
                           progress=(lambda name: print(f"checking {name} ...", file=sys.stderr)) if not args.json else None)
    if args.json:
        print(json.dumps(document(results, machine_info()), indent=2, default=str))
    else:
        print(table(results, "datapipe GPU self-test (docs/gpu.md)"))
    return exit_status(results)


def cluster_checks(args: argparse.Namespace, env: Mapping[str, str]) -> list:
    """doctor's cluster section: --ray ADDRESS, else RAY_ADDRESS, else --ray alone ('auto'); else one line."""
    from ..doctor.cluster import SizingOptions, ray_checks

    address = args.ray if args.ray not in (None, "auto") else env.get("RAY_ADDRESS") or args.ray
    sizing = SizingOptions(images_per_s=args.images_per_s, image_size=args.image_size,
                           jpeg_bytes=int(args.jpeg_kb * 1000), link_gbit=args.link_gbit)
    return ray_checks(address, sizing)


def run_doctor(args: argparse.Namespace) -> int:
    from ..doctor.pipeline import as_json, diagnose

    if args.gpu:
        return run_gpu_selftest(args)
    checks = diagnose(args.data, os.environ) + cluster_checks(args, os.environ)
    if args.json:
        print(json.dumps(as_json(checks), indent=2, default=str))
        return 0
    from ..errors import plain

    marks = {"ok": "  ok ", "warn": "WARN ", "info": "info "}
    for c in checks:  # a value may quote a path or a cluster's reply: no control character reaches the terminal
        print(f"{marks[c.status]} {c.name:24} {plain(c.value, 900)}" + (f"\n       -> {plain(c.hint, 900)}"
                                                                       if c.hint else ""))
    return 0
