"""The staging folder a conversion writes into, its progress checkpoint and source log, and the atomic publish."""
from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from datapipe.storage.durable import open_own
from datapipe.formats.base import fsync_file, write_json_atomic
from datapipe.records import SplitInfo

PROGRESS_NAME = "progress.json"
SOURCES_NAME = "sources.txt"
log = logging.getLogger(__name__)


@dataclass
class Progress:
    """How far a conversion got: tasks consumed, each split's counts and digest, the writer's state,
    and the length of the source log that covers the tasks consumed."""

    fingerprint: str
    arguments: dict[str, Any]
    done: int = 0
    splits: dict[str, SplitInfo] = field(default_factory=dict)
    writer: dict[str, Any] = field(default_factory=dict)
    sources: int = 0  # bytes of SourceLog (0: none, e.g. a run of an older version)

    def counts(self) -> dict[str, int]:
        return {name: info.samples for name, info in self.splits.items()}

    def save(self, staging: Path) -> None:
        write_json_atomic(staging / PROGRESS_NAME, json.dumps(asdict(self)))

    @classmethod
    def load(cls, staging: Path) -> "Progress | None":
        """The progress file of `staging`; None when there is none. A damaged one is a one-line ValueError."""
        file = staging / PROGRESS_NAME
        if not file.is_file():
            return None
        try:
            body = json.loads(file.read_text(encoding="utf-8"))
            body["splits"] = {name: SplitInfo(**info) for name, info in body["splits"].items()}
            progress = cls(**body)
            if not isinstance(progress.done, int) or progress.done < 0 or not isinstance(progress.writer, dict):
                raise TypeError("a count or the writer's state is malformed")
            return progress
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise ValueError(f"{file} is damaged ({type(exc).__name__}: {exc}); --overwrite starts the conversion "
                             "over") from None


class SourceLog:
    """The fingerprints (converters.sources) of the files an LMDB or HDF5 conversion consumed, a line
    each in write order: appended as it goes, made durable at each checkpoint before the progress
    file that counts them. Append-only, so 1.28M files cost one pass, not one rewrite per checkpoint."""

    def __init__(self, staging: Path, keep: int) -> None:
        fd = open_own(staging / SOURCES_NAME, os.O_WRONLY | os.O_CREAT | os.O_APPEND, what="source log")
        self._file = os.fdopen(fd, "ab")  # a link planted in a staging folder resumed: refused, not followed
        # lines past the last checkpoint are of files that will be read again
        self._file.truncate(min(keep, os.fstat(self._file.fileno()).st_size))

    def add(self, fingerprint: str) -> None:
        self._file.write(fingerprint.encode("ascii") + b"\n")

    def sync(self) -> int:
        """Make the log durable; returns its length."""
        self._file.flush()
        os.fsync(self._file.fileno())
        return os.fstat(self._file.fileno()).st_size

    def close(self) -> None:
        self._file.close()

    @staticmethod
    def read(staging: Path, length: int) -> Iterator[str]:
        """The fingerprints in the log's first `length` bytes, one per consumed file, streamed."""
        path = staging / SOURCES_NAME
        if length <= 0 or not path.is_file():
            return
        with open(path, "rb") as fh:
            for line in fh:
                length -= len(line)
                if length < 0:
                    return
                yield line.rstrip(b"\n").decode("ascii")


def mismatched_arguments(recorded: dict[str, Any], requested: dict[str, Any]) -> list[str]:
    """The options whose values differ between the interrupted run and this one."""
    return [f"{k}: was {recorded.get(k)!r}, now {requested.get(k)!r}"
            for k in sorted(set(recorded) | set(requested)) if recorded.get(k) != requested.get(k)]


def remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def publish(payload: Path, staging: Path, dst: Path) -> None:
    """Move the finished payload to `dst` in one rename; an existing dst is moved aside first and
    deleted only once the new one is in place, so no moment leaves neither."""
    old = dst.with_name(dst.name + ".old")
    if dst.exists() or dst.is_symlink():
        remove(old)
        os.replace(dst, old)
    os.replace(payload, dst)
    fsync_file(dst.parent)  # the rename itself made durable
    remove(old)
    for leftover in (PROGRESS_NAME, SOURCES_NAME) if dst.is_dir() else ():  # an LMDB folder is its staging folder
        (dst / leftover).unlink(missing_ok=True)
    if staging.exists():
        remove(staging)
