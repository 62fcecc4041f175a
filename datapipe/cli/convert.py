"""`datapipe convert`: its flags, the conversion (converters.convert) and its summary."""
from __future__ import annotations

import argparse
import logging
import sys

from ..formats import FORMATS
from .flags import parse_size, quoted


def add_command(sub: argparse._SubParsersAction) -> None:
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
    p.set_defaults(run=run_convert)


def run_convert(args: argparse.Namespace) -> int:
    from converters import ConvertOptions, convert

    from ..errors import counted, human_size, plain
    from ..storage import redact

    if args.quiet:
        logging.getLogger().setLevel(logging.WARNING)
    if args.quality is not None and args.resize_max is None:
        raise ValueError("--quality sets the JPEG quality of --resize-max's re-encode and does nothing alone: add "
                         "--resize-max N (an N above every image's shorter side, e.g. 4096, re-encodes without "
                         "resizing)")
    options = ConvertOptions(
        format=args.format, workers=args.workers, overwrite=args.overwrite, resume=args.resume,
        strict=args.strict, validate=args.validate, awkward=args.awkward, resize_max=args.resize_max,
        quality=args.quality or 90, shard_bytes=args.shard_size,
        labels=args.labels, layout=args.layout, split=args.split, seed=args.seed,
        checkpoint_every=args.checkpoint_every, progress=not args.quiet and sys.stderr.isatty(),
        engine=args.engine, ray_address=args.ray_address)
    try:
        report = convert(args.src, args.dst, options)
    except KeyboardInterrupt:
        print(redact(f"\ninterrupted: run `datapipe convert {quoted(args.src)} {quoted(args.dst)} --resume` to "
                     "finish"), file=sys.stderr)
        return 130
    total_bytes = sum(s.bytes for s in report.splits.values())
    what, rate = ("record", "rec/s") if report.source_format else ("file", "img/s")
    origin = f", from {report.source_format}" if report.source_format else ""
    took = f"{report.seconds:.{3 if report.seconds < 1 else 1}f}"  # a small job's 0.2 s is not "0.0 s"
    print(f"wrote {redact(report.dst)} ({report.format}{origin}) in {took} s: "
          f"{counted(report.processed, what)}, {report.images_per_s:.0f} {rate}, "
          f"{human_size(total_bytes / max(report.seconds, 1e-9))}/s")
    for name, info in report.splits.items():
        print(f"  {name}: {counted(info.samples, 'sample')}, {human_size(info.bytes)}, {len(info.skipped)} skipped")
    skipped = [bad for info in report.splits.values() for bad in info.skipped]
    for bad in skipped[:20]:
        print(f"  skipped {plain(bad['path'])}: {plain(bad['reason'])}")
    if len(skipped) > 20:
        print(f"  ... and {len(skipped) - 20} more: `datapipe info {quoted(args.dst)} --json` lists them all")
    return 0


def staging_exists(dst: str) -> bool:
    from pathlib import Path

    from ..formats import staging_path  # imported only on this failure path

    return staging_path(Path(dst)).exists()
