"""One shard job, written whole by one task: read, validate and store its files, then its record list.

The same function runs in a local worker process and in a Ray task, so both engines write the same
bytes. The record list (`{split}-{NNNNNN}.records.json`) says what the shard holds (record digests,
sample offsets, the files rejected and why) and which task list and options made it; the driver merges
the lists into the manifest, and `--resume` keeps every shard whose list is there and matches.
"""
from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from datapipe.image.decode import check_image
from datapipe.formats.wds import ShardFile
from datapipe.formats.wds_index import idx_name, sample_starts
from datapipe.image.headers import BadImageError
from datapipe.records import Record, field_union, record_digest
from datapipe.storage import RemoteStore, StoreNotFound, redact

from .errors import ConvertError, ShardFailed, StrictStop
from .sources import file_fingerprint, read_stat
from .targets import LIST_SUFFIX, Target
from .tasks import ShardJob, Task

Tick = Callable[[int, int], None]  # (files done, bytes stored) since the last call


@dataclass
class ShardRecords:
    """A shard's record list: its manifest entry (None when every file was rejected), its record
    digests and sample offsets in order, its rejected files, the files committed before it, and
    the fingerprint of each input file, which `--resume` compares."""

    name: str
    split: str
    plan: str  # the task list's fingerprint (the stored key 'plan': record lists written before stay readable)
    arguments: dict[str, Any]
    shard: dict[str, Any] | None = None
    digests: list[str] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)
    data_bytes: int = 0
    skipped: list[dict[str, Any]] = field(default_factory=list)
    files: dict[str, int] = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)  # each task's fingerprint (converters.sources)
    fields: list[str] = field(default_factory=list)  # FIELD_NAMES its stored records carry (SplitInfo.fields)

    @property
    def list_name(self) -> str:
        return self.name + LIST_SUFFIX

    @property
    def processed(self) -> int:
        return len(self.digests) + len(self.skipped)

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> "ShardRecords":
        return cls(**json.loads(text))


@dataclass(frozen=True)
class ShardContext:
    """What every shard task needs besides its job; small and picklable (it travels to Ray tasks)."""

    target: Target
    checks: dict[str, Any]  # check_image's options: validate, awkward, resize_max, quality
    fingerprint: str  # the task list's fingerprint
    arguments: dict[str, Any]  # the options that decide the bytes
    strict: bool = False
    source: RemoteStore | None = None  # the source when it is an object-store prefix


def read_source(task: Task, source: RemoteStore | None = None) -> tuple[bytes, os.stat_result | None]:
    """The bytes of one input file and its fstat (None for an object in a store), or BadImageError
    saying why it cannot be read. A file that is gone or unreadable is a bad file
    (converters.inputs); a disk or a store that fails is an error of the run."""
    if source is None:
        return read_stat(task.path)
    try:
        return source.read(task.relpath), None
    except StoreNotFound as exc:
        raise BadImageError(f"unreadable: {getattr(exc, 'strerror', None) or exc}") from None


def build_shard(job: ShardJob, ctx: ShardContext, tick: Tick | None = None) -> ShardRecords:
    """Write shard `job` to the target and return its record list (committed last)."""
    records = ShardRecords(job.name, job.split, ctx.fingerprint, ctx.arguments)
    with ctx.target.scratch(job.name) as folder:
        shard = ShardFile(folder, job.split, job.number)
        for position, task in enumerate(job.tasks, start=job.first):
            try:
                stored = _store_one(shard, task, position, ctx, records)
            except ConvertError:
                raise
            except OSError as exc:  # the disk or the store: the system's error, saying where it happened
                raise OSError(exc.errno, f"{exc.strerror or exc} (building shard {job.name}, at {task.relpath})",
                              exc.filename) from exc
            except Exception as exc:  # a failure of ours: name the shard and the file
                raise ShardFailed(redact(f"shard {job.name} failed at {task.path}: {type(exc).__name__}: {exc}")) from exc
            if tick is not None:
                tick(1, stored)
        files = []
        if shard.lines:
            records.shard = shard.finish()
            records.starts = sample_starts((folder / idx_name(shard.name)).read_text(encoding="ascii")).tolist()
            files = [shard.path, folder / idx_name(shard.name)]
        else:
            shard.discard()
        records.files = {f.name: f.stat().st_size for f in files}
        ctx.target.commit(files, records.list_name, records.to_json())
    return records


def _store_one(shard: ShardFile, task: Task, position: int, ctx: ShardContext, records: ShardRecords) -> int:
    """Validate one file and add it to the shard (or to the rejected list), and its fingerprint to
    the record list; returns bytes stored."""
    raw, st = b"", None
    try:
        raw, st = read_source(task, ctx.source)
        data = check_image(raw, **ctx.checks).data
    except BadImageError as exc:
        if ctx.strict:
            raise StrictStop(redact(f"{task.path}: {exc} (--strict stops at the first bad file)")) from None
        records.skipped.append({"path": task.relpath, "reason": str(exc), "position": position})
        records.sources.append(file_fingerprint(st, task.key, task.label, raw, fields=task.fields))
        return 0
    digest = record_digest(task.key, task.label, data, task.fields)
    records.sources.append(file_fingerprint(st, task.key, task.label, raw, (data, digest), task.fields))
    shard.add_record(position, Record(task.key, data, task.label, task.relpath, digest, task.fields))
    if task.fields:
        records.fields = field_union(records.fields, task.fields.to_json())
    records.digests.append(digest)
    records.data_bytes += len(data)
    return len(data)

