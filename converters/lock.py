"""One writer per output: `DST.lock` beside a conversion's destination, naming its holder (the
mechanism, shared with `datapipe train --out`, is datapipe.storage.output_lock: flock on this host, a
heartbeat for other hosts, a dead holder's lock taken over, a link at the path refused).
A second conversion to the same path is refused in one line naming the holder, before it looks at,
resumes or removes (`--overwrite`) the holder's staging folder.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from datapipe.storage.output_lock import STALE_S, describe, hold

from .errors import ConvertError

LOCK_SUFFIX = ".lock"
__all__ = ["LOCK_SUFFIX", "STALE_S", "describe", "lock_path", "writer_lock"]


def lock_path(dst: Path) -> Path:
    return dst.with_name(dst.name + LOCK_SUFFIX)


@contextlib.contextmanager
def writer_lock(dst: Path, *, host: str | None = None) -> Iterator[dict]:
    """Hold the one-writer lock of `dst` for the block; a ConvertError naming the holder when another
    conversion holds it, or saying to remove what was planted at `DST.lock`."""
    with hold(lock_path(dst), busy=f"another conversion to {dst} is running", error=ConvertError, host=host) as mine:
        yield mine
