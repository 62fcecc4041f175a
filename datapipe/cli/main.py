"""The `datapipe` command: the parser from one module a subcommand (each `add_command(sub)` adds its flags
and its runner), then one run, its expected failure printed as one line. Environment reads live in cli/ only."""
from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from ..errors import ExpectedError
from . import bench, convert, doctor, info, preview, train, verify
from .flags import quoted

COMMANDS = (convert, info, verify, bench, train, doctor, preview)  # `datapipe --help` lists them in this order
SHOWN_LINE = 1000  # characters of an error's line at most (the adversarial harness's rule: no longer line)


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
    for command in COMMANDS:
        command.add_command(sub)
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
        if args.command == "convert" and convert.staging_exists(args.dst):
            kept = (f"; the finished part is kept: fix this, then `datapipe convert {quoted(args.src)} "
                    f"{quoted(args.dst)} --resume`")
        print(_shown(redact(f"datapipe {args.command}: error: {exc.strerror or exc}{where}{kept}")), file=sys.stderr)
        return 1


def _shown(message: str) -> str:
    """An error as the terminal gets it: a name from a dataset or a file cannot move the cursor, retitle
    or clear it (control characters shown as escapes, line breaks kept), nor fill the screen (each line
    cut to SHOWN_LINE characters)."""
    from ..errors import plain
    return "\n".join(plain(line, limit=SHOWN_LINE) for line in message.split("\n")[:20])
