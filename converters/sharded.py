"""`convert` to `.wds`: fix every shard's files before work starts, write whole shards in parallel on
an engine (local processes or Ray), then merge their record lists into the offsets files, the shard
tables (`{split}.shards.bin`, datapipe.formats.shard_table) and the manifest, written last.

No process writes another's shard and the driver touches no image bytes, so a conversion scales
with the cores (or nodes) that build shards; the output depends only on the task list and the options,
never on the engine, the number of workers or the order shards finish in.
"""
from __future__ import annotations

import contextlib
import hashlib
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import numpy as np

from tqdm import tqdm

from datapipe.formats.shard_table import table_file
from datapipe.formats.wds_index import offsets_file
from datapipe.records import MANIFEST_NAME, TABLE_VERSION, Manifest, SplitInfo, chain_digest, field_union

from .engines import Engine
from .errors import ConvertError
from .shards import ShardContext, ShardRecords
from .sources import changed_files, name_some
from .staging import mismatched_arguments
from .targets import LIST_SUFFIX, Target
from .tasks import ShardJob, TaskList, shard_jobs

log = logging.getLogger(__name__)


@dataclass
class ShardedResult:
    splits: dict[str, SplitInfo]
    seconds: float
    processed: int
    shards: dict[str, list[dict[str, Any]]]  # each split's shards (name, samples, bytes, sha256), in its table


def finished_shards(target: Target, jobs: list[ShardJob], task_list: TaskList,
                    arguments: dict[str, Any]) -> Iterator[ShardRecords]:
    """The shards an interrupted run committed whole, in shard order: a record list made by this task list
    with these options, its shard files present at their recorded sizes, and none of its input files
    rewritten since (converters.sources). Others are built again: a shard is written whole, so one
    built again holds the new bytes and nothing of the old."""
    listing = target.listing()
    for job in jobs:
        name = job.name + LIST_SUFFIX
        if name not in listing:
            continue
        try:
            records = ShardRecords.from_json(target.read_text(name))
        except (ValueError, TypeError) as exc:
            log.warning("%s is damaged (%s); building that shard again", target.describe(name), exc)
            continue
        diff = mismatched_arguments(records.arguments, arguments)
        if diff:
            raise ConvertError(f"--resume with other options than the interrupted run ({'; '.join(diff)}); "
                               "pass the same options, or --overwrite to start over")
        if records.plan != task_list.fingerprint:  # ShardRecords' stored key 'plan', kept
            raise ConvertError("the source changed since the interrupted conversion; --overwrite starts over")
        if not all(listing.get(f) == size for f, size in records.files.items()):
            continue
        changed = changed_files(job.tasks, records.sources)
        if changed:
            log.info("%s: %d of its files changed since it was built (%s); building it again",
                     job.name, len(changed), name_some(changed))
            continue
        yield records


class Merger:
    """Folds record lists, arriving in any order, into each split's counts, chained digest, rejected
    files, shards and sample offsets, in shard order. Only lists that arrive ahead of their
    turn wait, so the driver never holds a whole dataset's digests (14M for ImageNet-21k)."""

    def __init__(self, task_list: TaskList, jobs: list[ShardJob]) -> None:
        self.order = [job.name for job in jobs]
        self.next = 0
        self.waiting: dict[str, ShardRecords] = {}
        self.splits = {s: SplitInfo(skipped=list(task_list.skipped[s])) for s in task_list.splits}
        self.starts: dict[str, list[np.ndarray]] = {s: [] for s in task_list.splits}
        self.shards: dict[str, list[dict[str, Any]]] = {s: [] for s in task_list.splits}

    def add(self, records: ShardRecords) -> None:
        self.waiting[records.name] = records
        while self.next < len(self.order) and self.order[self.next] in self.waiting:
            self._fold(self.waiting.pop(self.order[self.next]))
            self.next += 1

    def _fold(self, records: ShardRecords) -> None:
        info = self.splits[records.split]
        for digest in records.digests:
            info.digest = chain_digest(info.digest, digest)
        info.samples += len(records.digests)
        info.bytes += records.data_bytes
        info.skipped += records.skipped
        info.fields = field_union(info.fields, records.fields)
        if records.shard is not None:
            self.shards[records.split].append(records.shard)
            self.starts[records.split].append(np.asarray(records.starts, dtype=np.int64))

    def finish(self, target: Target) -> dict[str, SplitInfo]:
        """The merged splits, with each split's offsets file and shard table written to the target."""
        if self.next != len(self.order):
            raise RuntimeError(f"shard {self.order[self.next]} never finished; the engine lost it")
        for split, info in self.splits.items():
            name, blob = offsets_file(split, self.starts[split])
            target.put(name, blob)
            info.index = {"name": name, "bytes": len(blob), "sha256": hashlib.sha256(blob).hexdigest()}
            name, blob, info.table = table_file(split, self.shards[split])
            target.put(name, blob)
        return self.splits


def write_shards(task_list: TaskList, ctx: ShardContext, engine: Engine, *, shard_bytes: int, resume: bool,
                 progress: bool, fmt: str, source: str) -> ShardedResult:
    """Build every shard not already committed, then the offsets files and the manifest (last);
    the record lists are deleted once the manifest is written."""
    jobs = shard_jobs(task_list, shard_bytes)
    merger, done, kept_files = Merger(task_list, jobs), set(), 0
    for records in finished_shards(ctx.target, jobs, task_list, ctx.arguments) if resume else ():
        merger.add(records)
        done.add(records.name)
        kept_files += records.processed
    if done:
        log.info("resuming: %d of %d shards are complete", len(done), len(jobs))
    ctx.target.clear_scratch()
    todo = [job for job in jobs if job.name not in done]
    started = time.perf_counter()
    bar = tqdm(total=len(task_list.tasks), initial=kept_files, unit="img",
               disable=not progress, dynamic_ncols=True, smoothing=0.05)
    stored = [0]

    def tick(files: int, nbytes: int) -> None:
        stored[0] += nbytes
        bar.update(files)
        bar.set_postfix_str(f"{stored[0] / 1e6 / max(time.perf_counter() - started, 1e-9):.1f} MB/s", refresh=False)

    built = engine.run(todo, ctx, tick)
    with bar, contextlib.closing(built):  # an error here stops the engine's work at once
        for records in built:
            merger.add(records)
    ctx.target.clear_scratch()  # what killed attempts left
    seconds = time.perf_counter() - started
    splits = merger.finish(ctx.target)
    manifest = Manifest(fmt, task_list.classes, splits, arguments={**ctx.arguments, "source": source},
                        version=TABLE_VERSION, created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                        seconds=round(seconds, 3))
    ctx.target.put(MANIFEST_NAME, manifest.to_json().encode("utf-8"))
    for job in jobs:
        ctx.target.delete(job.name + LIST_SUFFIX)
    return ShardedResult(splits, seconds, sum(len(j.tasks) for j in todo), merger.shards)
