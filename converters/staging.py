"""The staging folder a conversion writes into, its progress checkpoint, and the atomic publish."""
from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from datapipe.formats.base import fsync_file, write_json_atomic
from datapipe.records import SplitInfo

PROGRESS_NAME = "progress.json"
log = logging.getLogger(__name__)


@dataclass
class Progress:
    """How far a conversion got: tasks consumed, each split's counts and digest, the writer's state."""

    fingerprint: str
    arguments: dict[str, Any]
    done: int = 0
    splits: dict[str, SplitInfo] = field(default_factory=dict)
    writer: dict[str, Any] = field(default_factory=dict)

    def counts(self) -> dict[str, int]:
        return {name: info.samples for name, info in self.splits.items()}

    def save(self, staging: Path) -> None:
        write_json_atomic(staging / PROGRESS_NAME, json.dumps(asdict(self)))

    @classmethod
    def load(cls, staging: Path) -> "Progress | None":
        file = staging / PROGRESS_NAME
        if not file.is_file():
            return None
        body = json.loads(file.read_text(encoding="utf-8"))
        body["splits"] = {name: SplitInfo(**info) for name, info in body["splits"].items()}
        return cls(**body)


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
    leftover = (dst / PROGRESS_NAME) if dst.is_dir() else None
    if leftover is not None and leftover.exists():
        leftover.unlink()
    if staging.exists():
        remove(staging)
