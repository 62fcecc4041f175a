"""`convert` from a packed dataset (LMDB, HDF5 or .wds, a .wds also at a URL) into another format.

Each split's records are read through datapipe.formats and written through the destination's writer
(`FormatSpec.writer`), as they are: keys, encoded bytes, labels, original paths, captions, metadata
and multi-labels, with the class list and the source's record of skipped files. Each record is
checked against its checksum as it is read. Written into a staging folder with checkpoints
(--resume), published in one rename, as a conversion from images is. Into .wds from an LMDB or HDF5
dataset (stored in class order), the records are shuffled by --seed before shards are cut, as
`convert` shuffles images; other repacks keep the order.
"""
from __future__ import annotations

import array
import hashlib
import shlex
import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from datapipe.errors import first_line
from datapipe.formats import FORMATS, FormatSpec, format_for, open_dataset, read_manifest, staging_path
from datapipe.formats.base import Dataset, Writer
from datapipe.records import Manifest, Record, SplitInfo, record_digest
from datapipe.formats.scan import check_key
from datapipe.storage import StoreNotFound, is_url, redact

from .errors import ConvertError
from .lock import writer_lock
from .pack import ConvertOptions, ConvertReport, auto_shard_bytes, check_destination
from .staging import Progress, mismatched_arguments, publish, remove

# Options that say how image files become records; a repack copies records, so they must keep their defaults.
IMAGE_OPTIONS = {"labels": ("--labels", None), "layout": ("--layout", "auto"), "validate": ("--validate", "decode"),
                 "awkward": ("--awkward", "original"), "resize_max": ("--resize-max", None),
                 "engine": ("--engine", "local"), "ray_address": ("--ray-address", None)}


def packed_source(src: str | Path) -> Manifest | None:
    """The manifest of `src` when it is a packed dataset (what `repack` reads), else None."""
    if is_url(src):
        try:
            return read_manifest(str(src))
        except StoreNotFound:  # an image folder in a store: converted from its images
            return None
    return read_manifest(Path(src))


@dataclass(frozen=True)
class Plan:
    """What a repack copies: the source (its manifest), the destination format, the splits in order."""

    src: str | Path
    manifest: Manifest
    spec: FormatSpec
    splits: tuple[str, ...]
    shuffle: bool  # .wds from a dataset stored in class order: records shuffled before shards are cut
    seed: int

    @property
    def shown(self) -> str:
        return redact(str(self.src))

    def order(self, split: str) -> np.ndarray | None:
        """Write position -> source index: a permutation seeded by (seed, split), or None (the source order)."""
        if not self.shuffle:
            return None
        seed = int.from_bytes(hashlib.sha256(f"{self.seed}/{split}".encode()).digest()[:8], "little")
        return np.random.default_rng(seed).permutation(self.manifest.splits[split].samples)

    def arguments(self, options: ConvertOptions) -> dict[str, Any]:
        """What decides the output (compared on --resume), as ConvertOptions.content_arguments does."""
        sharded = {"shard_bytes": options.shard_bytes, "seed": options.seed} if self.spec.sharded else {}
        return {"format": self.spec.name, "split": options.split, **sharded,
                "repacked_from": {"format": self.manifest.format, "manifest_sha256": self.manifest.digest(),
                                  "arguments": self.manifest.arguments}}


def plan_repack(src: str | Path, dst: Path, options: ConvertOptions, manifest: Manifest) -> tuple[Plan, ConvertOptions]:
    """The plan and the options with the shard size resolved; refuses the options that do not apply."""
    for name, (flag, default) in IMAGE_OPTIONS.items():
        if getattr(options, name) != default:
            raise ConvertError(f"{flag} applies to image files; {redact(str(src))} is a packed {manifest.format} "
                               "dataset, whose records are copied as they are (encoded bytes, keys, labels). "
                               f"Leave {flag} out, or convert the original images")
    spec = format_for(dst, options.format)
    if options.split is not None:
        manifest.split(options.split)  # SplitNotFound lists the splits there are
    splits = tuple(s for s in manifest.splits if options.split in (None, s))
    _check_counts(src, manifest)
    if options.shard_bytes is None:
        options = replace(options, shard_bytes=auto_shard_bytes(sum(manifest.splits[s].bytes for s in splits)))
    shuffle = spec.sharded and not FORMATS[manifest.format].sharded
    return Plan(src, manifest, spec, splits, shuffle, options.seed), options


MIN_RECORD_BYTES = 64  # no stored record is smaller (the smallest image files are ~70 bytes, before metadata)


def _check_counts(src: str | Path, manifest: Manifest) -> None:
    """The manifest's record counts fit in the files that hold them: a crafted count (10^12 records) is
    refused here, before anything is sized from it (the shuffle's permutation, 8 bytes a record)."""
    if is_url(src):  # a .wds in a store: its reader checks the count against the shard table's at open
        return
    path = Path(src)
    files = [path] if path.is_file() else [p for p in path.iterdir() if p.is_file()]
    size = sum(p.stat().st_size for p in files)
    claimed = sum(info.samples for info in manifest.splits.values())
    if claimed * MIN_RECORD_BYTES > size:
        raise ConvertError(f"{redact(str(src))}: its manifest counts {claimed} records, more than its {size} bytes "
                           "of files can hold; the dataset is damaged or was crafted")


def repack(src: str | Path, dst: Path, options: ConvertOptions, manifest: Manifest) -> ConvertReport:
    """Copy every record of the packed dataset `src` (its manifest given) into `dst`, in the format
    its suffix (or options.format) selects; converters.convert.convert calls this for a packed `src`."""
    if manifest.format not in FORMATS:
        raise ConvertError(f"{redact(str(src))} has format {manifest.format!r}, which this datapipe cannot read "
                           f"({sorted(FORMATS)})")
    plan, options = plan_repack(src, dst, options, manifest)
    with writer_lock(dst):
        staging = staging_path(dst)
        check_destination(src if is_url(src) else Path(src), dst, staging, options)
        dst.parent.mkdir(parents=True, exist_ok=True)
        writer, progress = _start(plan, options, staging)
        started = time.perf_counter()
        try:
            copied = _copy(plan, writer, progress, staging, options)
        except BaseException:  # the staging folder stays for --resume
            writer.abort()
            raise
        seconds = time.perf_counter() - started
        source = str(src) if is_url(src) else str(Path(src).resolve())
        out = Manifest(plan.spec.name, list(manifest.classes), progress.splits,
                       arguments={**progress.arguments, "source": redact(source)},
                       created=datetime.now(timezone.utc).isoformat(timespec="seconds"), seconds=round(seconds, 3))
        writer.close(out)
        publish(writer.payload, staging, dst)
    done = {name: replace(info, skipped=[]) for name, info in out.splits.items()}  # none skipped by this run
    return ConvertReport(dst, plan.spec.name, done, seconds, copied, source_format=manifest.format)


def _start(plan: Plan, options: ConvertOptions, staging: Path) -> tuple[Writer, Progress]:
    """The writer on a fresh staging folder, or restored from the last checkpoint (--resume)."""
    arguments = plan.arguments(options)
    progress = Progress.load(staging) if options.resume and staging.exists() else None
    spec, size = plan.spec, sum(plan.manifest.splits[s].bytes for s in plan.splits)
    if progress is not None:
        diff = mismatched_arguments(progress.arguments, arguments)
        if diff:
            raise ConvertError(f"--resume with other options than the interrupted run ({'; '.join(diff)}); "
                               "pass the same options, or --overwrite to start over")
        if progress.fingerprint != plan.manifest.digest():
            raise ConvertError(f"{plan.shown} changed since the interrupted conversion; --overwrite starts over")
        writer = spec.writer(staging, size_hint=size, shard_bytes=options.shard_bytes)
        writer.restore(progress.writer, progress.counts())
        return writer, progress
    remove(staging)
    skipped = {s: [{k: v for k, v in e.items() if k != "position"} for e in plan.manifest.splits[s].skipped]
               for s in plan.splits}  # the source's skipped files; the records get positions 0.. here
    progress = Progress(plan.manifest.digest(), arguments, splits={s: SplitInfo(skipped=skipped[s])
                                                                   for s in plan.splits})
    writer = spec.writer(staging, size_hint=size, shard_bytes=options.shard_bytes)
    progress.save(staging)
    return writer, progress


def _copy(plan: Plan, writer: Writer, progress: Progress, staging: Path, options: ConvertOptions) -> int:
    """Copy the records after `progress`'s into `writer`, checkpointing as it goes; the records copied."""
    total = sum(plan.manifest.splits[s].samples for s in plan.splits)
    bar = tqdm(total=total, initial=progress.done, unit="rec", disable=not options.progress, dynamic_ncols=True)
    copied = 0
    with bar:
        for split in plan.splits:
            info, ds, order = progress.splits[split], open_dataset(plan.src, split), plan.order(split)
            keys = KeyCheck(plan, split)
            keys.add_written(ds, order, info.samples)
            for position in range(info.samples, len(ds)):
                record = checked_record(plan, ds, position if order is None else int(order[position]))
                keys.add(record.key)
                writer.write(split, info.samples, record)
                info.add(record)
                progress.done += 1
                copied += 1
                if progress.done % options.checkpoint_every == 0:
                    progress.writer = writer.checkpoint()
                    progress.save(staging)
                bar.update()
            keys.check()
    return copied


def checked_record(plan: Plan, ds: Dataset, index: int) -> Record:
    """Record `index` of `ds`, once it matches its checksum, its label is a class and its key a key."""
    where = f"{plan.shown}: split {ds.split!r} record {index}"
    verify = f"`datapipe verify {shlex.quote(plan.shown)}` lists what is damaged"
    try:
        record = ds.record(index)
    except OSError:
        raise
    except Exception as exc:  # a damaged store raises from its library: one line naming the record
        raise ConvertError(f"{where} cannot be read ({first_line(exc)}); {verify}") from None
    if record_digest(record.key, record.label, record.data, record.fields) != record.sha256:
        raise ConvertError(f"{where} does not match its checksum (its bytes, label or key changed); {verify}")
    classes = len(plan.manifest.classes)
    labels = record.fields.labels or ()
    if not all(0 <= label < classes for label in (record.label, *labels)):
        raise ConvertError(f"{where} has a label that is not one of the {classes} classes; the dataset is damaged "
                           "or was crafted")
    check_key(record.key, where)
    for name, text in (("path", record.path), ("caption", record.fields.text), ("metadata", record.fields.meta)):
        if text is not None and not (isinstance(text, str) and text.encode("utf-8", "replace").decode() == text):
            raise ConvertError(f"{where}: its {name} is not text (a string that encodes as UTF-8); the dataset is "
                               "damaged or was crafted")
    return record


class KeyCheck:
    """The keys of one split's records are unique (.wds readers group a sample's files by key): a
    64-bit hash of each record read, 8 bytes a record, checked when the split is copied."""

    def __init__(self, plan: Plan, split: str) -> None:
        self.plan, self.split = plan, split
        self.hashes = array.array("Q")

    def add(self, key: str) -> None:
        self.hashes.append(int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little"))

    def add_written(self, ds: Dataset, order: np.ndarray | None, count: int) -> None:
        """The keys of the `count` records an interrupted run copied (read again: resumes are rare)."""
        for position in range(count):
            self.add(ds.record(position if order is None else int(order[position])).key)

    def check(self) -> None:
        hashes = np.frombuffer(self.hashes, dtype=np.uint64)
        values = np.unique(hashes)
        if len(values) == len(hashes):
            return
        twice = len(hashes) - len(values)
        raise ConvertError(f"{self.plan.shown}: split {self.split!r} repeats the key of {twice} record(s) (keys are "
                           "unique in a dataset); the dataset is damaged or was crafted")
