"""`datapipe verify`: every record re-read and checked against the manifest's checksums."""
from __future__ import annotations

import argparse
import sys


def add_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("verify", help="re-read every record and check it against the manifest's checksums")
    p.add_argument("path")
    p.add_argument("--sha256", help="first check that the LMDB/HDF5 file has this sha256 (from its trusted source); "
                   "a file that does not is never parsed")
    p.set_defaults(run=run_verify)


def run_verify(args: argparse.Namespace) -> int:
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
