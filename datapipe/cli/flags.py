"""Flag parsers and helpers several subcommands share: sizes, a pool size, Ray resources, the remote-data
options, the library's log level for a block, a path quoted for a printed command, RAY_ADDRESS."""
from __future__ import annotations

import argparse
import contextlib
import logging
import re
from collections.abc import Iterator

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "ki": 1 << 10, "mi": 1 << 20,
          "gi": 1 << 30, "ti": 1 << 40}


@contextlib.contextmanager
def library_quiet(level: int, *, unless: bool) -> Iterator[None]:
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


def quoted(path: str) -> str:
    """A path as a printed command gives it, so the command runs as printed (spaces, quotes)."""
    import shlex

    return shlex.quote(path)


def pool_size(text: str) -> int | str:
    """'auto' or a pool size."""
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a pool size; write a number or auto") from None


def ray_resources(text: str) -> tuple[tuple[str, float], ...]:
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


def join_ray_address() -> None:
    """Join RAY_ADDRESS's cluster where it is set (the product reads no environment: the CLI does), probed
    first: where none answers, one line within ray_setup.JOIN_TIMEOUT_S."""
    import os

    if os.environ.get("RAY_ADDRESS"):
        from ..ray_setup import import_ray, join
        join(import_ray(), os.environ["RAY_ADDRESS"])


def add_remote_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sampling", default="auto", choices=["auto", "global", "shards"],
                   help="shards: shard-wise order (default for s3:// gs:// az:// http(s):// data); global: one permutation")
    p.add_argument("--cache-dir", help="where remote shards are cached (default: node-local, $TMPDIR or /tmp, /datapipe-UID/shards)")
    p.add_argument("--cache-limit", type=parse_size, help="bytes the shard cache may hold, e.g. 200GB (default: no limit)")
