"""`datapipe info`: a packed dataset (or an image folder) described, or the mix of several."""
from __future__ import annotations

import argparse
import json

from .mix import add_mix_arguments, mix_lines, source_of_args


def add_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("info", help="describe a packed dataset (or an image folder), or the mix of several")
    p.add_argument("path", nargs="+", help="a dataset; several (NAME=PATH or a path) with --weights: their mix")
    p.add_argument("--json", action="store_true", help="print the description as JSON")
    add_mix_arguments(p)
    p.set_defaults(run=run_info)


def run_info(args: argparse.Namespace) -> int:
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
