"""`datapipe bench`: its flags, the measurements (datapipe.bench), the table, verdicts, JSON and plot."""
from __future__ import annotations

import argparse
import logging
import sys

from ..backends.registry import backend_names, local_backends
from .flags import add_remote_options, join_ray_address, library_quiet, ray_resources


def add_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="measure read, decode and loader throughput against a naive baseline")
    p.add_argument("data", nargs="+", help="packed datasets, image folders or shard patterns")
    p.add_argument("--backends", "--backend", default=",".join(local_backends()),
                   help=f"comma-separated, of {','.join(backend_names())} (default: all but ray; ray: a pool "
                        "of Ray actors, on the Ray at RAY_ADDRESS, else a local one; docs/pool.md)")
    p.add_argument("--pool-workers", type=pool_sizes, default=(), metavar="N[,N...]",
                   help="backend ray: the pool sizes to run, one row each (default: --workers's value)")
    p.add_argument("--pool-resources", type=ray_resources, default=(), metavar="NAME=N[,NAME=N]",
                   help="backend ray: Ray resources each actor asks for, e.g. datapipe=1 keeps the pool on the nodes "
                        "started with --resources='{\"datapipe\": N}' (docs/clusters.md)")
    p.add_argument("--suites", default="read,decode,baseline,pipeline,h2d",
                   help="comma-separated, of read,decode,baseline,pipeline,loader,h2d (default: all but loader, "
                        "which times num_workers and prefetch_factor)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--seconds", type=float, default=10.0, help="timed seconds per repeat at most (default 10)")
    p.add_argument("--repeats", type=int, default=3, help="timed repeats; the median is reported (default 3)")
    p.add_argument("--warmup", type=int, default=2, help="untimed batches before each repeat (default 2)")
    p.add_argument("--workers", type=int, help="loader workers (default: this rank's share of the cores, as the "
                   "loaders' num_workers=None)")
    p.add_argument("--simulate-step", type=float, default=0.0, metavar="MS",
                   help="a fake training step of MS milliseconds per batch; reports data_wait_pct")
    p.add_argument("--split", default="train")
    p.add_argument("--recipe", help="the loaders serve this augmentation preset (deit, rsb-a3, ffcv-rn50, tv-v2; "
                   "default: crop + flip)")
    p.add_argument("--json", metavar="FILE", help="write the results as JSON")
    p.add_argument("--plot", metavar="FILE.png", help="write a bar chart (needs matplotlib)")
    add_remote_options(p)
    p.set_defaults(run=run_bench)


def pool_sizes(text: str) -> tuple[int, ...]:
    """'1,2,4' -> (1, 2, 4)."""
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of pool sizes; write e.g. 1,2,4") from None


def run_bench(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ..bench import BenchOptions, run_bench
    from ..bench.report import document, plot, table, write_json
    from ..bench.sanity import no_figure, short_data_lines
    from ..bench.verdicts import verdict_table, verdicts
    from ..doctor.pipeline import machine_info

    options = BenchOptions(
        backends=tuple(b for b in args.backends.split(",") if b), batch_size=args.batch_size,
        image_size=args.image_size, seconds=args.seconds, repeats=args.repeats, warmup=args.warmup,
        workers=args.workers, simulate_step_ms=args.simulate_step, split=args.split, sampling=args.sampling,
        cache_dir=args.cache_dir, cache_limit=args.cache_limit, recipe=args.recipe, pool_workers=args.pool_workers,
        pool_resources=args.pool_resources)
    if "ray" in options.backends:
        join_ray_address()
    # no "backend (requested)" line per loader built: the progress bar is the only output
    with library_quiet(logging.WARNING, unless=args.verbose):
        rows = run_bench(args.data, options, suites=tuple(s for s in args.suites.split(",") if s),
                         progress=sys.stderr.isatty())
    found = verdicts(rows)
    machine = machine_info()
    print(table(rows))
    for line in short_data_lines(rows):
        print(line)
    print()
    print(verdict_table(found))
    if args.json:
        write_json(Path(args.json), document(rows, machine, vars(args) | {"run": None}, found))
        print(f"wrote {args.json}")
    if args.plot:
        gpu = machine["gpu"]["name"] if machine["gpu"] else "no GPU"
        plot(Path(args.plot), rows, f"datapipe bench: {machine['cores']} cores, {gpu}, "
                                    f"{args.image_size}px, batch {args.batch_size}", found)
        print(f"wrote {args.plot}")
    if reason := no_figure(rows):
        raise ValueError(reason)
    return 0
