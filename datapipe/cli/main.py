"""The `datapipe` command: parse, call one library function, print. Environment reads live here only."""
from __future__ import annotations

import argparse
import contextlib
import json
import logging
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import NoReturn

from ..backends.registry import backend_choices, backend_names, local_backends
from ..errors import ExpectedError
from ..formats import FORMATS
from .doctor import add_doctor
from .mix import add_mix_arguments, mix_lines, source_of_args

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)?\s*$", re.IGNORECASE)
SHOWN_LINE = 1000  # characters of an error's line at most (the adversarial harness's rule: no longer line)
_UNITS = {"": 1, "b": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "ki": 1 << 10, "mi": 1 << 20,
          "gi": 1 << 30, "ti": 1 << 40}


@contextlib.contextmanager
def _library_quiet(level: int, *, unless: bool) -> Iterator[None]:
    """The library's "datapipe" logger at `level` for the block (not where `unless`, i.e. --verbose)."""
    logger = logging.getLogger("datapipe")
    before = logger.level
    if not unless:
        logger.setLevel(level)
    try:
        yield
    finally:
        logger.setLevel(before)


def parse_size(text: str) -> int:
    """'256MB' -> 256000000, '1GiB' -> 1073741824, '5000' -> 5000."""
    m = _SIZE.match(text)
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size; write e.g. 256MB, 1GB or 1048576")
    unit = (m.group(2) or "").lower().rstrip("b")
    return int(float(m.group(1)) * _UNITS[unit])


def _add_convert(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("convert", help="pack an image folder into LMDB (.lmdb), HDF5 (.h5) or WebDataset (.wds), "
                                       "or a packed dataset into another of them")
    p.add_argument("src", help="image folder: SRC/CLASS/* or SRC/SPLIT/CLASS/*, or flat with --labels; or a folder "
                   "holding ImageNet's downloaded archives, read without extracting them (docs/imagenet.md); or a "
                   "packed dataset (.lmdb, .h5, .wds): its records copied as they are (docs/converting.md)")
    p.add_argument("dst", help="output: *.lmdb, *.h5/*.hdf5, or *.wds (a folder of shards)")
    p.add_argument("--format", choices=list(FORMATS), help="override the format the suffix selects")
    p.add_argument("--workers", type=int, default=0, help="reader processes (default: all cores)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output")
    p.add_argument("--resume", action="store_true", help="finish an interrupted conversion")
    p.add_argument("--strict", action="store_true", help="stop at the first bad file instead of skipping it")
    p.add_argument("--validate", choices=["decode", "fast"], default="decode",
                   help="decode: JPEGs decode at 1/8 scale (catches truncation and corrupt data, default); "
                        "fast: JPEG header + end marker only (catches truncation)")
    p.add_argument("--awkward", choices=["original", "png"], default="original",
                   help="CMYK, EXIF-rotated, palette and RGBA images: keep their original bytes (datapipe's "
                        "backends apply the RGB rule when decoding, default) or store RGB PNGs that any "
                        "other decoder reads by the rule (bigger, slower to load)")
    p.add_argument("--resize-max", type=int, metavar="N",
                   help="re-encode every image as JPEG, shorter side at most N (N above every image's: no "
                        "resizing, as FFCV's jpg writer stores them)")
    p.add_argument("--quality", type=int, help="JPEG quality of --resize-max's re-encode (default 90)")
    p.add_argument("--shard-size", type=parse_size, default=None,
                   help="WebDataset shard size (default: the input's size / 128, within 16MiB..256MiB, so "
                        "readers that give each worker whole shards have enough of them)")
    p.add_argument("--labels", metavar="CSV", help="flat folder: CSV of filename,class rows")
    p.add_argument("--layout", choices=["auto", "classes", "splits"], default="auto",
                   help="SRC/CLASS/* (classes) or SRC/SPLIT/CLASS/* (splits); auto looks for train/val")
    p.add_argument("--split", help="split name for a single-split source (default train; val with --labels); "
                   "ImageNet's archives: the one split to convert (train or val)")
    p.add_argument("--seed", type=int, default=0, help="seed of the WebDataset write-time shuffle")
    p.add_argument("--checkpoint-every", type=int, default=1000, metavar="N",
                   help="LMDB/HDF5: files between resumable checkpoints (default 1000; .wds resumes by shard)")
    p.add_argument("--engine", choices=["local", "ray"], default="local",
                   help=".wds: build shards on this machine's cores (local) or as tasks on a Ray cluster "
                        "(ray; pip install 'datapipe[ray]'; SRC and DST on a filesystem every node mounts, "
                        "or DST a URL)")
    p.add_argument("--ray-address", metavar="auto|HOST:PORT",
                   help="the Ray cluster to use (auto: the one `ray start` runs here; default: RAY_ADDRESS's, "
                        "else a local Ray on 127.0.0.1 started for this conversion)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar and no INFO lines (warnings, the "
                   "skipped files and the summary still print)")
    p.set_defaults(run=_run_convert)


def _run_convert(args: argparse.Namespace) -> int:
    from converters import ConvertOptions, convert

    if args.quiet:
        logging.getLogger().setLevel(logging.WARNING)
    from ..errors import counted, plain
    from ..errors import human_size as _human

    if args.quality is not None and args.resize_max is None:
        raise ValueError("--quality sets the JPEG quality of --resize-max's re-encode and does nothing alone: add "
                         "--resize-max N (an N above every image's shorter side, e.g. 4096, re-encodes without "
                         "resizing)")
    options = ConvertOptions(
        format=args.format, workers=args.workers, overwrite=args.overwrite, resume=args.resume,
        strict=args.strict, validate=args.validate, awkward=args.awkward, resize_max=args.resize_max, quality=args.quality or 90, shard_bytes=args.shard_size,
        labels=args.labels, layout=args.layout, split=args.split, seed=args.seed,
        checkpoint_every=args.checkpoint_every, progress=not args.quiet and sys.stderr.isatty(),
        engine=args.engine, ray_address=args.ray_address)
    from ..storage import redact

    try:
        report = convert(args.src, args.dst, options)
    except KeyboardInterrupt:
        print(redact(f"\ninterrupted: run `datapipe convert {_quoted(args.src)} {_quoted(args.dst)} --resume` to "
                     "finish"), file=sys.stderr)
        return 130
    total_bytes = sum(s.bytes for s in report.splits.values())
    what, rate = ("record", "rec/s") if report.source_format else ("file", "img/s")
    origin = f", from {report.source_format}" if report.source_format else ""
    took = f"{report.seconds:.{3 if report.seconds < 1 else 1}f}"  # a small job's 0.2 s is not "0.0 s"
    print(f"wrote {redact(report.dst)} ({report.format}{origin}) in {took} s: "
          f"{counted(report.processed, what)}, {report.images_per_s:.0f} {rate}, "
          f"{_human(total_bytes / max(report.seconds, 1e-9))}/s")
    for name, info in report.splits.items():
        print(f"  {name}: {counted(info.samples, 'sample')}, {_human(info.bytes)}, {len(info.skipped)} skipped")
    skipped = [bad for info in report.splits.values() for bad in info.skipped]
    for bad in skipped[:20]:
        print(f"  skipped {plain(bad['path'])}: {plain(bad['reason'])}")
    if len(skipped) > 20:
        print(f"  ... and {len(skipped) - 20} more: `datapipe info {_quoted(args.dst)} --json` lists them all")
    return 0


def _quoted(path: str) -> str:
    """A path as a printed command gives it, so the command runs as printed (spaces, quotes)."""
    import shlex

    return shlex.quote(path)


def _run_info(args: argparse.Namespace) -> int:
    from ..formats.inspect import class_names, describe, info_lines

    source = source_of_args(args.path, args.weights, args.epoch_size)
    if not isinstance(source, str):  # a mix: its table, then its classes
        classes = list(source.classes)
        print(json.dumps({"epoch_size": len(source), "classes": classes, "sources": source.table(0)}, indent=2)
              if args.json else "\n".join([*mix_lines(source), f"classes: {class_names(classes)}"]))
        return 0
    body = describe(source)
    print(json.dumps(body, indent=2) if args.json else "\n".join(info_lines(body)))
    return 0


def _run_verify(args: argparse.Namespace) -> int:
    from ..formats.inspect import verify

    from ..storage import redact

    report = verify(args.path, progress=sys.stderr.isatty(), sha256=args.sha256)
    if report.ok:
        print(f"{redact(args.path)}: OK, {report.records} records match their checksums and the manifest")
        return 0
    print(redact(f"{args.path}: DAMAGED, {len(report.problems)} problem(s); first: {report.problems[0]}"))
    for line in report.problems[1:20]:
        print(redact(f"  {line}"))
    return 1


def _add_bench(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="measure read, decode and loader throughput against a naive baseline")
    p.add_argument("data", nargs="+", help="packed datasets, image folders or shard patterns")
    p.add_argument("--backends", "--backend", default=",".join(local_backends()),
                   help=f"comma-separated, of {','.join(backend_names())} (default: all but ray; ray: a pool "
                        "of Ray actors, on the Ray at RAY_ADDRESS, else a local one; docs/pool.md)")
    p.add_argument("--pool-workers", type=_sizes, default=(), metavar="N[,N...]",
                   help="backend ray: the pool sizes to run, one row each (default: --workers's value)")
    p.add_argument("--pool-resources", type=_resources, default=(), metavar="NAME=N[,NAME=N]",
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
    _add_remote_options(p)
    p.set_defaults(run=_run_bench)


def _sizes(text: str) -> tuple[int, ...]:
    """'1,2,4' -> (1, 2, 4)."""
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of pool sizes; write e.g. 1,2,4") from None


def _pool_size(text: str) -> int | str:
    """'auto' or a pool size."""
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a pool size; write a number or auto") from None


def _join_ray_address() -> None:
    """Join RAY_ADDRESS's cluster where it is set (the product reads no environment: the CLI does), probed
    first: where none answers, one line within ray_setup.JOIN_TIMEOUT_S."""
    import os

    if os.environ.get("RAY_ADDRESS"):
        from ..ray_setup import import_ray, join
        join(import_ray(), os.environ["RAY_ADDRESS"])


def _resources(text: str) -> tuple[tuple[str, float], ...]:
    """'datapipe=1' -> (('datapipe', 1.0),), within Ray's limits on an amount (pool_sizing.resource_pairs)."""
    from ..pool_sizing import resource_pairs

    try:
        pairs = tuple((name.strip(), float(amount)) for name, amount in (x.split("=") for x in text.split(",") if x))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of Ray resources; write e.g. datapipe=1") from None
    try:
        return resource_pairs(pairs, "--pool-resources")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _run_bench(args: argparse.Namespace) -> int:
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
        _join_ray_address()
    # no "backend (requested)" line per loader built: the progress bar is the only output
    with _library_quiet(logging.WARNING, unless=args.verbose):
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


def _add_remote_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sampling", default="auto", choices=["auto", "global", "shards"],
                   help="shards: shard-wise order (default for s3:// gs:// az:// http(s):// data); global: one permutation")
    p.add_argument("--cache-dir", help="where remote shards are cached (default: node-local, $TMPDIR or /tmp, /datapipe-UID/shards)")
    p.add_argument("--cache-limit", type=parse_size, help="bytes the shard cache may hold, e.g. 200GB (default: no limit)")


def _add_train(sub: argparse._SubParsersAction) -> None:
    from .recipe import add_recipe_options

    # Options left out stay out of the namespace: TrainConfig's defaults apply, or on --resume the
    # checkpoint's run settings (what the command line gives wins).
    p = sub.add_parser("train", help="reference AMP/DDP training loop (run under torchrun for several GPUs)",
                       argument_default=argparse.SUPPRESS)
    p.add_argument("data", nargs="+", help="packed dataset or image folder (train split; val split evaluated if "
                                           "present); several (NAME=PATH or a path) with --weights: their mix")
    add_mix_arguments(p)
    _add_train_optimization(p)
    _add_train_data(p)
    _add_train_run(p)
    _add_remote_options(p)
    add_recipe_options(p)
    p.add_argument("--out", required=True, help="folder for metrics.jsonl, last.pt, summary.json")
    p.add_argument("--resume", metavar="LAST_PT",
                   help="continue from a checkpoint (mid-epoch included) with its settings, but for those given again")
    p.add_argument("--requeue", choices=["auto", "off"],
                   help="SIGTERM, SIGUSR1, SIGINT: finish the step, write OUT/last.pt, exit 75. auto (default): on "
                        "SIGUSR1 under Slurm (SLURM_JOB_ID set) also `scontrol requeue` the job; off: never")
    p.set_defaults(run=_run_train)


def _add_train_optimization(p: argparse.ArgumentParser) -> None:
    """`datapipe train`'s model, optimizer and schedule."""
    p.add_argument("--model", metavar="NAME", help="resnet18|34|50|101, deit_tiny|small|base (or timm's names: "
                   "deit_small_patch16_224, vit_small_patch16_224, ...), timm/NAME or torchvision/NAME where that "
                   "package is installed; default: resnet50")
    p.add_argument("--epochs", type=int, help="default: 1")
    p.add_argument("--batch-size", type=int, help="per GPU (per process); default: 256")
    p.add_argument("--opt", choices=["sgd", "adamw"], help="default: sgd (momentum 0.9); adamw: no weight decay on "
                   "biases and norm weights, as timm")
    p.add_argument("--lr", type=float, help="default: 0.1 (sgd), 1e-3 (adamw)")
    p.add_argument("--weight-decay", type=float, help="default: 1e-4 (sgd), 0.05 (adamw)")
    p.add_argument("--warmup-epochs", type=float, help="default: 1")
    p.add_argument("--warmup-lr", type=float, help="the warm-up rises from this lr; default: 0")
    p.add_argument("--min-lr", type=float, help="the cosine decays to this lr; default: 0")
    p.add_argument("--label-smoothing", type=float,
                   help="smoothing of integer labels in the loss; default: 0.1. A recipe with soft targets (mixup, "
                        "cutmix, --smoothing) carries its own smoothing and is not smoothed again")
    p.add_argument("--model-ema", action="store_true", help="keep an EMA of the weights, saved and evaluated too")
    p.add_argument("--model-ema-decay", type=float, help="default: 0.9998")


def _add_train_data(p: argparse.ArgumentParser) -> None:
    """`datapipe train`'s image sizes and loader."""
    p.add_argument("--image-size", metavar="N|MIN:MAX",
                   help="train size: N px, or MIN:MAX, FFCV's ramp over the run (from 3/4 to 7/8 of --epochs, by "
                        "32 px); default: the recipe's (ffcv-rn50 160:192, rsb-a3 160, tv-v2 176, else 224)")
    p.add_argument("--image-size-schedule", metavar="FILE",
                   help='train sizes from a JSON file: {"0": 128, "10": 160} (epoch: size from then on) or a list, one '
                        "size an epoch (the last continues); instead of --image-size")
    p.add_argument("--eval-size", type=int, metavar="N", help="val size (FixRes: larger than train); default: the "
                   "recipe's with its train sizes (ffcv-rn50 256, rsb-a3 and tv-v2 224), else the last train size")
    p.add_argument("--backend", choices=backend_choices(),
                   help="default: auto; ray: a pool of Ray actors decodes (the Ray at RAY_ADDRESS, else a local one; "
                        "docs/pool.md)")
    p.add_argument("--workers", type=int, help="loader workers per process (default: this rank's share of the CPUs)")
    p.add_argument("--pool-workers", type=_pool_size, metavar="N|auto",
                   help="backend ray: actors in each rank's pool, or auto (grows while training waits on data; "
                        "default: --workers's value)")
    p.add_argument("--pool-resources", type=_resources, metavar="NAME=N[,NAME=N]",
                   help="backend ray: Ray resources each actor asks for, e.g. datapipe=1 (docs/clusters.md)")


def _add_train_run(p: argparse.ArgumentParser) -> None:
    """`datapipe train`'s precision, compilation, logging, checkpoints and stops."""
    p.add_argument("--amp", choices=["bf16", "fp16", "off"], help="default: bf16 where the GPU supports it, else off")
    p.add_argument("--accum-steps", type=int, help="gradient accumulation steps; default: 1")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--checkpoint-activations", action="store_true", help="recompute activations (big models)")
    p.add_argument("--no-channels-last", action="store_true", help="keep NCHW contiguous memory format")
    p.add_argument("--profile", action="store_true", help="write a torch.profiler trace of a few steps to OUT/profile")
    p.add_argument("--tensorboard", metavar="DIR",
                   help="TensorBoard scalars (rank 0) in DIR; default: OUT/tensorboard when tensorboard is installed; "
                        "'off': none")
    p.add_argument("--seed", type=int, help="default: 0")
    p.add_argument("--log-every", type=int, help="steps between loss logs (the only host syncs); default: 50")
    p.add_argument("--save-every", type=int, help="also checkpoint every N steps (default: epoch ends)")
    p.add_argument("--max-steps", type=int, help="stop after N optimizer steps, checkpointing the position")
    p.add_argument("--skip-nonfinite", action="store_true",
                   help="skip steps whose loss or gradients are inf/NaN and count them (default: stop with an error)")
    p.add_argument("--start-method", choices=["fork", "spawn", "forkserver"],
                   help="worker start method (default: fork; DALI on CUDA: spawn)")


def _run_train(args: argparse.Namespace) -> int:
    from .train import run_train

    if getattr(args, "backend", None) == "ray":  # unset options are absent
        _join_ray_address()
    return run_train(args)


def _add_preview(sub: argparse._SubParsersAction) -> None:
    from .recipe import add_recipe_options

    p = sub.add_parser("preview", help="a PNG grid of a few records over a few epochs as training receives them, "
                                       "from each backend side by side (same record, same view)")
    p.add_argument("data", nargs="+", help="packed dataset, image folder or shards; several (NAME=PATH or a path) "
                                           "with --weights: their mix (each tile names its source)")
    add_mix_arguments(p)
    add_recipe_options(p, "every recipe flag `datapipe train` takes, so what trains is seen first")
    p.add_argument("--out", required=True, metavar="FILE.png", help="where to write the grid")
    p.add_argument("--records", type=int, default=6, help="records per row: each epoch's first batch (default 6)")
    p.add_argument("--epochs", type=int, default=3, help="epochs 0..N-1, one row per backend each (default 3)")
    p.add_argument("--backends", default="threads,dataloader,dali",
                   help="comma-separated (default: threads,dataloader,dali; one not installed is skipped)")
    p.add_argument("--image-size", type=int, default=128, help="default: 128")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--split", default="train")
    p.set_defaults(run=_run_preview)


def _run_preview(args: argparse.Namespace) -> int:
    from .recipe import train_recipe
    from ..errors import counted
    from ..preview import PreviewOptions, describe_recipe, preview

    options = PreviewOptions(recipe=train_recipe(args, {}) or "default", records=args.records, epochs=args.epochs,
                             backends=tuple(b for b in args.backends.split(",") if b), image_size=args.image_size,
                             seed=args.seed, split=args.split)
    with _library_quiet(logging.ERROR, unless=args.verbose):  # the loaders' own lines become the notes below
        shown = preview(source_of_args(args.data, args.weights, args.epoch_size, split=args.split), options)
    for note in shown.notes:
        print(f"note: {note}")
    path = shown.save(args.out)
    backends = list(dict.fromkeys(row.backend for row in shown.rows))
    print(f"wrote {path}: {counted(options.epochs, 'epoch')} x {', '.join(backends)}, "
          f"{counted(options.records, 'record')} each, recipe {describe_recipe(options.recipe)}")
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse's usage errors quote what was given (an unknown argument, a bad choice): that quote is
    redacted (a URL's password) and shown as a terminal line (_shown), as the commands' own errors are."""

    def error(self, message: str) -> NoReturn:
        from ..storage.redaction import redact

        self.print_usage(sys.stderr)
        self.exit(2, _shown(redact(f"{self.prog}: error: {message}")) + "\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="datapipe", description="Pack image datasets (LMDB, HDF5, WebDataset), "
                     "check and describe them, and measure, preview and train on their loaders.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_convert(sub)
    p = sub.add_parser("info", help="describe a packed dataset (or an image folder), or the mix of several")
    p.add_argument("path", nargs="+", help="a dataset; several (NAME=PATH or a path) with --weights: their mix")
    p.add_argument("--json", action="store_true", help="print the description as JSON")
    add_mix_arguments(p)
    p.set_defaults(run=_run_info)
    p = sub.add_parser("verify", help="re-read every record and check it against the manifest's checksums")
    p.add_argument("path")
    p.add_argument("--sha256", help="first check that the LMDB/HDF5 file has this sha256 (from its trusted source); "
                   "a file that does not is never parsed")
    p.set_defaults(run=_run_verify)
    _add_bench(sub)
    _add_train(sub)
    add_doctor(sub)
    _add_preview(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from ..storage.redaction import RedactingFilter, redact

    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format="%(levelname)s %(message)s")
    for handler in logging.getLogger().handlers:  # a secret in any library's log line is masked
        handler.addFilter(RedactingFilter())
    run: Callable[[argparse.Namespace], int] = args.run
    try:
        return run(args)
    except (ValueError, ImportError, ExpectedError) as exc:
        print(_shown(redact(f"datapipe {args.command}: error: {exc}")), file=sys.stderr)
        return 2
    except OSError as exc:  # permission denied, disk full, a path that is a file: the system's words
        where = f" ({exc.filename})" if exc.filename else ""
        kept = ""
        if args.command == "convert" and staging_exists(args.dst):
            kept = (f"; the finished part is kept: fix this, then `datapipe convert {_quoted(args.src)} "
                    f"{_quoted(args.dst)} --resume`")
        print(_shown(redact(f"datapipe {args.command}: error: {exc.strerror or exc}{where}{kept}")), file=sys.stderr)
        return 1


def _shown(message: str) -> str:
    """An error as the terminal gets it: a name from a dataset or a file cannot move the cursor, retitle
    or clear it (control characters shown as escapes, line breaks kept), nor fill the screen (each line
    cut to SHOWN_LINE characters)."""
    from ..errors import plain
    return "\n".join(plain(line, limit=SHOWN_LINE) for line in message.split("\n")[:20])


def staging_exists(dst: str) -> bool:
    from pathlib import Path

    from ..formats import staging_path  # imported only on this failure path

    return staging_path(Path(dst)).exists()
