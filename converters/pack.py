"""`convert`: read and validate images in parallel, write them through datapipe.formats, finish atomically.

`.wds` is written shard by shard by parallel tasks (`converters.sharded`, on the local or the Ray
engine). LMDB and HDF5 are single files with one writer: workers read and check files
(datapipe.image.decode.check_image) and the main process writes them in write order, so the output is
identical for any number of workers and after any --resume; every `checkpoint_every` files the
writer makes its data durable and then the progress file is replaced.
"""
from __future__ import annotations

import contextlib
import itertools
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tqdm import tqdm

from datapipe.image.decode import AWKWARD, VALIDATION, check_image
from datapipe.formats import FormatSpec, format_for, staging_path
from datapipe.image.headers import BadImageError
from datapipe.ray_setup import RayUnreachable
from datapipe.records import Fields, Manifest, Record, SplitInfo, record_digest
from datapipe.resources import cpus_per_rank
from datapipe.storage import RemoteStore, is_url, redact

from .engines import ENGINES, Engine, make_engine
from .errors import ConvertError, StrictStop
from .inputs import open_input, reading
from .lock import writer_lock
from .sharded import ShardedResult, write_shards
from .shards import ShardContext
from .sources import NONE, changed_files, file_fingerprint, name_some, read_stat, stat_key
from .staging import Progress, SourceLog, mismatched_arguments, publish, remove
from .targets import FolderTarget, Target
from .tasks import Task, TaskList, list_tasks
from .workers import WorkerPool

log = logging.getLogger(__name__)
MIN_AUTO_SHARD, MAX_AUTO_SHARD, TARGET_SHARDS = 16 << 20, 256 << 20, 128


def auto_shard_bytes(input_bytes: int) -> int:
    """The default shard size: the input split into about 128 shards, within 16-256 MiB. Readers
    that give each worker whole shards (the webdataset library, DALI's readers.webdataset, the
    shard-wise order over ranks x workers) need many shards: at 256 MB a 350 MB dataset had two, and
    the webdataset library read it at 419 img/s against 557 with 32 MB shards (issue #12). ImageNet
    (~140 GB) still gets 256 MiB shards (~550 of them)."""
    return min(MAX_AUTO_SHARD, max(MIN_AUTO_SHARD, (input_bytes // TARGET_SHARDS) >> 20 << 20))


@dataclass(frozen=True)
class ConvertOptions:
    """How to convert; only `content_arguments()` decide what is written (workers, progress do not)."""

    format: str | None = None
    workers: int = 0
    overwrite: bool = False
    resume: bool = False
    strict: bool = False
    validate: str = "decode"
    awkward: str = "original"
    resize_max: int | None = None
    quality: int = 90
    shard_bytes: int | None = None  # None: auto_shard_bytes(the input's size)
    labels: str | None = None
    layout: str = "auto"
    split: str | None = None
    seed: int = 0
    checkpoint_every: int = 1000
    progress: bool = True
    engine: str = "local"  # .wds only: "local" (this machine's cores) or "ray" (a Ray cluster)
    ray_address: str | None = None  # --engine ray: "auto", HOST:PORT, or None for a local Ray

    def __post_init__(self) -> None:
        if self.validate not in VALIDATION:
            raise ValueError(f"validate must be one of {VALIDATION}, got {self.validate!r}")
        if self.awkward not in AWKWARD:
            raise ValueError(f"awkward must be one of {AWKWARD}, got {self.awkward!r}")
        if self.workers < 0:
            raise ValueError(f"workers must be >= 0 (0 = all cores), got {self.workers}")
        if self.resize_max is not None and self.resize_max < 8:
            raise ValueError(f"resize_max must be at least 8 pixels, got {self.resize_max}")
        if not 1 <= self.quality <= 100:
            raise ValueError(f"quality must be within 1..100, got {self.quality}")
        if self.shard_bytes is not None and self.shard_bytes < 64 << 10:
            raise ValueError(f"shard size must be at least 64KiB, got {self.shard_bytes} bytes")
        if self.checkpoint_every < 1:
            raise ValueError(f"checkpoint_every must be >= 1, got {self.checkpoint_every}")
        if self.engine not in ENGINES:
            raise ValueError(f"engine must be one of {ENGINES}, got {self.engine!r}")
        if self.ray_address is not None and self.engine != "ray":
            raise ValueError("a Ray address only applies with engine='ray' (--engine ray)")

    @property
    def checks(self) -> dict[str, Any]:
        """check_image's options: how to validate and what to store."""
        return dict(resize_max=self.resize_max, quality=self.quality, validate=self.validate, awkward=self.awkward)

    def content_arguments(self, spec: FormatSpec) -> dict[str, Any]:
        sharded = {"shard_bytes": self.shard_bytes, "seed": self.seed} if spec.sharded else {}
        return {"format": spec.name, "validate": self.validate, "awkward": self.awkward, "resize_max": self.resize_max, "quality": self.quality,
                "labels": self.labels, "layout": self.layout, "split": self.split, **sharded}


@dataclass
class ConvertReport:
    """What a conversion wrote: per-split info (counts, bytes, skipped), time, and throughput."""

    dst: Path
    format: str
    splits: dict[str, SplitInfo]
    seconds: float
    processed: int
    source_format: str | None = None  # a packed dataset's format when its records were repacked (converters.repack)

    @property
    def images_per_s(self) -> float:
        return self.processed / self.seconds if self.seconds else 0.0

    @property
    def skipped(self) -> int:
        return sum(len(s.skipped) for s in self.splits.values())


_WORKER_OPTIONS: dict[str, Any] = {}


def _init_worker(options: dict[str, Any]) -> None:
    _WORKER_OPTIONS.update(options)


Result = tuple[bytes | tuple[int, ...] | None, str, str]


def _identity(st: os.stat_result) -> tuple[int, ...]:
    return (st.st_dev, *stat_key(st))


def _prepare(job: tuple[str, str, int, Fields]) -> Result:
    """Read, check and digest one file in a worker: (the file's identity, record digest) when its
    original bytes are stored (the writer reads the file again from the page cache rather than
    receiving its bytes through a pipe: ~0.5 ms less per image, measured), (converted bytes, record
    digest), or (None, the reason the file is bad); and the file's fingerprint for --resume
    (converters.sources: NONE when it could not be read)."""
    path, key, label, fields = job
    try:
        raw, st = read_stat(path)
    except BadImageError as exc:
        return None, str(exc), NONE
    try:
        data = check_image(raw, **_WORKER_OPTIONS).data
    except BadImageError as exc:
        return None, str(exc), file_fingerprint(st, key, label, raw, fields=fields)
    digest = record_digest(key, label, data, fields)
    return _identity(st) if data is raw else data, digest, file_fingerprint(st, key, label, raw, (data, digest), fields)


def _stored_bytes(task: Task, payload: bytes | tuple[int, ...]) -> bytes:
    """The bytes a worker validated: its converted bytes, or the file read again, which must still
    be the file the worker read (device, inode, size, mtime and ctime; BadImageError otherwise).
    Nothing in user space sets ctime, so a rewrite in between shows even when it keeps the mtime."""
    if isinstance(payload, bytes):
        return payload
    with reading(task.path), open_input(task.path) as fh:
        if _identity(os.fstat(fh.fileno())) != payload:
            raise BadImageError("changed while it was being converted")
        return fh.read()


def _results(tasks: list[Task], workers: int, options: ConvertOptions, staging: Path) -> Iterator[Result]:
    """Each task's `_prepare` result, in order, from `workers` forked processes (here when 1)."""
    jobs = [(t.path, t.key, t.label, t.fields) for t in tasks]
    checks = options.checks
    if workers == 1:
        _init_worker(checks)
        yield from map(_prepare, jobs)
        return
    with WorkerPool(workers, lambda i: f"reading {tasks[i].path}", str(staging),
                    initializer=_init_worker, initargs=(checks,)) as pool:
        yield from pool.map(_prepare, jobs, chunk=16)


def _start(src: Path, dst: Path, options: ConvertOptions, spec: FormatSpec, task_list: TaskList,
           staging: Path) -> tuple[Any, Progress]:
    """Open the writer on a fresh staging folder, or restore it from the last checkpoint (--resume)."""
    arguments = options.content_arguments(spec)
    progress = Progress.load(staging) if options.resume and staging.exists() else None
    if progress is not None:
        diff = mismatched_arguments(progress.arguments, arguments)
        if diff:
            raise ConvertError(f"--resume with other options than the interrupted run ({'; '.join(diff)}); "
                               "pass the same options, or --overwrite to start over")
        if progress.fingerprint != task_list.fingerprint:
            raise ConvertError(f"{src} changed since the interrupted conversion; --overwrite starts over")
        _check_sources(task_list, progress, staging)
        try:
            writer = spec.writer(staging, size_hint=task_list.input_bytes, shard_bytes=options.shard_bytes)
            writer.restore(progress.writer, progress.counts())
            log.info("resuming %s after %d of %d files", dst, progress.done, len(task_list.tasks))
            return writer, progress
        except Exception as exc:  # a crash can leave a store its library refuses to reopen
            log.warning("cannot reopen the interrupted output (%s); converting from the start", exc)
    remove(staging)
    progress = Progress(task_list.fingerprint, arguments, splits={s: SplitInfo(skipped=list(v))
                                                                  for s, v in task_list.skipped.items()})
    writer = spec.writer(staging, size_hint=task_list.input_bytes, shard_bytes=options.shard_bytes)
    progress.save(staging)
    return writer, progress


def _check_sources(task_list: TaskList, progress: Progress, staging: Path) -> None:
    """Refuse to resume when a file the interrupted run packed was rewritten since (same name and
    size: the task list still matches). LMDB and HDF5 records follow one another in write order and each
    split's digest chains them, so one record cannot be replaced; .wds builds the shard again."""
    packed = itertools.islice(task_list.tasks, progress.done)
    changed = changed_files(packed, SourceLog.read(staging, progress.sources))
    if changed:
        raise ConvertError(f"{len(changed)} source file(s) changed since the interrupted conversion packed them "
                           f"({name_some(changed)}); --overwrite converts again from the start")


def check_destination(src: str | Path, dst: Path, staging: Path, options: ConvertOptions) -> None:
    if isinstance(src, Path) and (dst.resolve() == src.resolve() or src.resolve() in dst.resolve().parents):
        raise ConvertError(f"the destination {dst} must not be the source folder or inside it")
    if dst.exists() and not options.overwrite:
        if options.resume and not staging.exists():
            raise ConvertError(f"{dst} is complete: there is nothing to resume (--overwrite converts it again)")
        raise ConvertError(f"{dst} already exists; pass --overwrite to replace it")
    if staging.exists() and not (options.resume or options.overwrite):
        raise ConvertError(f"an interrupted conversion left {staging}; pass --resume to finish it "
                           "or --overwrite to start over")


def prepare(src: str | Path, spec: FormatSpec, options: ConvertOptions) -> tuple[TaskList, ConvertOptions]:
    """The task list (what will be written), and the options with the shard size resolved; refuses what
    cannot be done (--strict with files the scan rejected, Ray with a single-writer format)."""
    if options.engine == "ray" and not spec.sharded:
        raise ConvertError(f"--engine ray writes .wds only: {spec.name} is a single file with one writer. "
                           "Convert to .wds (shards written in parallel on the cluster), or use --engine local")
    if is_url(src) and not spec.sharded:
        raise ConvertError(f"reading the images from object storage writes .wds only, not {spec.name}; convert "
                           "to .wds, or copy the images to a local disk first")
    task_list = list_tasks(src, labels=options.labels, layout=options.layout, split=options.split,
                           shuffle_seed=options.seed if spec.sharded else None)
    rejected = [bad for bads in task_list.skipped.values() for bad in bads]
    if options.strict and rejected:
        raise StrictStop(f"{rejected[0]['path']}: {rejected[0]['reason']} (--strict stops at the first bad file)")
    if options.shard_bytes is None:
        options = replace(options, shard_bytes=auto_shard_bytes(task_list.input_bytes))
    return task_list, options


def run_sharded(src: str | Path, target: Target, task_list: TaskList, spec: FormatSpec, options: ConvertOptions,
                engine: Engine | None = None) -> ShardedResult:
    """Write a .wds dataset's shards, offsets and manifest into `target` on `engine` (by default the
    one the options name); `src` is a folder or an object-store prefix."""
    source = RemoteStore(str(src)) if is_url(src) else None
    src = redact(str(src)) if is_url(src) else str(Path(src).resolve())
    ctx = ShardContext(target, options.checks, task_list.fingerprint, options.content_arguments(spec), options.strict,
                       source)
    engine = engine or make_engine(options.engine, workers=options.workers or cpus_per_rank(),
                                   ray_address=options.ray_address)
    return write_shards(task_list, ctx, engine, shard_bytes=options.shard_bytes,
                        resume=options.resume, progress=options.progress, fmt=spec.name, source=src)


def convert_local(src: str | Path, dst: Path, options: ConvertOptions, engine: Engine | None = None) -> ConvertReport:
    """Pack `src` into the local path `dst` (converters.convert.convert picks this for a local `dst`)."""
    src = str(src) if is_url(src) else Path(src)
    spec = format_for(dst, options.format)
    with writer_lock(dst):  # one writer per output: before the staging folder is looked at or removed
        return _convert_locked(src, dst, spec, options, engine)


def _convert_locked(src: str | Path, dst: Path, spec: FormatSpec, options: ConvertOptions,
                    engine: Engine | None) -> ConvertReport:
    staging = staging_path(dst)
    check_destination(src, dst, staging, options)
    task_list, options = prepare(src, spec, options)
    dst.parent.mkdir(parents=True, exist_ok=True)
    if spec.sharded:
        return _convert_sharded(src, dst, staging, task_list, spec, options, engine)
    writer, progress = _start(src, dst, options, spec, task_list, staging)
    started = time.perf_counter()
    try:
        with contextlib.closing(SourceLog(staging, progress.sources)) as sources:
            processed = _write_all(task_list, writer, progress, sources, staging, options)
    except StrictStop:  # nothing worth resuming
        writer.abort()
        remove(staging)
        raise
    except BaseException:  # interrupted: the staging folder stays for --resume
        writer.abort()
        raise
    seconds = time.perf_counter() - started
    manifest = Manifest(spec.name, task_list.classes, progress.splits,
                        arguments={**progress.arguments, "source": str(src.resolve())},
                        created=datetime.now(timezone.utc).isoformat(timespec="seconds"), seconds=round(seconds, 3))
    writer.close(manifest)
    publish(writer.payload, staging, dst)
    return ConvertReport(dst, spec.name, progress.splits, seconds, processed)


def _convert_sharded(src: str | Path, dst: Path, staging: Path, task_list: TaskList, spec: FormatSpec,
                     options: ConvertOptions, engine: Engine | None) -> ConvertReport:
    fresh = not (options.resume and staging.is_dir())
    if fresh:
        remove(staging)
    staging.mkdir(parents=True, exist_ok=True)
    try:
        result = run_sharded(src, FolderTarget(staging), task_list, spec, options, engine)
    except StrictStop:
        remove(staging)
        raise
    except RayUnreachable:  # no cluster answered: nothing was converted, so nothing is kept for --resume
        if fresh and not any(staging.iterdir()):
            remove(staging)
        raise
    publish(staging, staging, dst)
    return ConvertReport(dst, spec.name, result.splits, result.seconds, result.processed)


def _write_all(task_list: TaskList, writer: Any, progress: Progress, sources: SourceLog, staging: Path,
               options: ConvertOptions) -> int:
    """Validate and write every task after `progress.done`, logging each file's fingerprint;
    checkpoint as it goes. Returns files processed."""
    todo = task_list.tasks[progress.done:]
    workers = options.workers or cpus_per_rank()
    bar = tqdm(total=len(task_list.tasks), initial=progress.done, unit="img", disable=not options.progress,
               dynamic_ncols=True, smoothing=0.05)
    megabytes, last, started = 0.0, 0.0, time.perf_counter()
    results = _results(todo, min(workers, max(1, len(todo))), options, staging)
    with bar, contextlib.closing(results):  # an error here stops the workers at once
        for (payload, digest_or_reason, source), task in zip(results, todo):
            info = progress.splits[task.split]
            try:
                data = None if payload is None else _stored_bytes(task, payload)
            except BadImageError as exc:
                data, digest_or_reason = None, str(exc)
            if data is None:
                reason = digest_or_reason
                if options.strict:
                    raise StrictStop(f"{task.path}: {reason} (--strict stops at the first bad file)")
                log.debug("skipping %s: %s", task.path, reason)
                info.skipped.append({"path": task.relpath, "reason": reason})
            else:
                record = Record(task.key, data, task.label, task.relpath, digest_or_reason, task.fields)
                writer.write(task.split, info.samples, record)
                info.add(record)
                megabytes += len(data) / 1e6
            sources.add(source)
            progress.done += 1
            if progress.done % options.checkpoint_every == 0:
                progress.writer = writer.checkpoint()
                progress.sources = sources.sync()
                progress.save(staging)
            bar.update()
            now = time.perf_counter()
            if now - last > 0.5:
                bar.set_postfix_str(f"{megabytes / (now - started):.1f} MB/s", refresh=False)
                last = now
    return len(todo)
