"""`datapipe preview`: a PNG grid of a few records over a few epochs, each backend side by side."""
from __future__ import annotations

import argparse
import logging

from ..backends.registry import local_backends, preview_backends
from .flags import library_quiet
from .mix import add_mix_arguments, source_of_args


def add_command(sub: argparse._SubParsersAction) -> None:
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
    p.add_argument("--backends", default=",".join(preview_backends()),
                   help=f"comma-separated, of {','.join(local_backends())} (default: {','.join(preview_backends())}; "
                        "one not installed is skipped)")
    p.add_argument("--image-size", type=int, default=128, help="default: 128")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--split", default="train")
    p.set_defaults(run=run_preview)


def run_preview(args: argparse.Namespace) -> int:
    from ..errors import counted, plain
    from ..preview import PreviewOptions, describe_recipe, preview
    from .recipe import train_recipe

    options = PreviewOptions(recipe=train_recipe(args, {}) or "default", records=args.records, epochs=args.epochs,
                             backends=tuple(b for b in args.backends.split(",") if b), image_size=args.image_size,
                             seed=args.seed, split=args.split)
    with library_quiet(logging.ERROR, unless=args.verbose):  # the loaders' own lines become the notes below
        shown = preview(source_of_args(args.data, args.weights, args.epoch_size, split=args.split), options)
    for note in shown.notes:  # a plugin's names and a bad file's reason may hold anything: one bounded line each
        print(f"note: {plain(note, 900)}")
    path = shown.save(args.out)
    backends = list(dict.fromkeys(row.backend for row in shown.rows))
    print(f"wrote {path}: {counted(options.epochs, 'epoch')} x {', '.join(backends)}, "
          f"{counted(options.records, 'record')} each, recipe {describe_recipe(options.recipe)}")
    return 0
