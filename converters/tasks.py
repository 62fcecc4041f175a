"""What a conversion will write: every input file in write order, with its split, key and label."""
from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import os
import random
from dataclasses import dataclass
from pathlib import Path

from datapipe.formats.tar import BLOCK, padded
from datapipe.records import NO_FIELDS, Fields
from datapipe.formats.scan import FolderLayout, ImageFile, scan_folder, scan_labelled
from datapipe.storage.urls import is_url, redact

from .imagenet import scan_imagenet
from .inputs import unreadable_reason
from .parquet import scan_parquet
from .tar_shards import scan_tar_shards


@dataclass(frozen=True)
class Task:
    """One input file to read, validate and store."""

    split: str
    path: str
    relpath: str
    key: str
    label: int
    size: int = 0  # bytes on disk (or in the store) when listed
    fields: Fields = NO_FIELDS  # caption, JSON metadata, multi-labels (known at scan time; small)


@dataclass(frozen=True)
class TaskList:
    """All tasks in write order plus what the scan already rejected; the fingerprint pins it for --resume."""

    classes: list[str]
    tasks: list[Task]
    skipped: dict[str, list[dict[str, str]]]
    input_bytes: int
    fingerprint: str

    @property
    def splits(self) -> list[str]:
        return list(self.skipped)


def _ordered_splits(names: list[str]) -> list[str]:
    return sorted(names, key=lambda s: (s not in ("train", "training"), s))


def _size(f: ImageFile, skipped: list[dict[str, str]]) -> int | None:
    """The file's size (from a store's listing, or its stat); None, and the file added to `skipped`
    with the reason, when it cannot be read (a dangling symlink, a file gone since it was listed)."""
    if f.size is not None:
        return f.size
    try:
        return os.stat(f.path).st_size
    except OSError as exc:
        reason = unreadable_reason(str(f.path), exc)
        if reason is None:
            raise
        skipped.append({"path": f.relpath, "reason": reason})
        return None


def tasks_from_layout(layout: FolderLayout, *, shuffle_seed: int | None, url: str | None = None) -> TaskList:
    """Tasks split by split (train first); within a split sorted like ImageFolder, or shuffled by seed.
    For a store prefix (`url`) each task's path is its object's URL and sizes come from the listing."""
    tasks: list[Task] = []
    digest = hashlib.sha256()
    total = 0
    skipped = {s: list(layout.skipped.get(s, [])) for s in _ordered_splits(list(layout.splits))}
    for split in skipped:
        files = list(layout.splits[split])
        if shuffle_seed is not None:
            random.Random(f"{shuffle_seed}/{split}").shuffle(files)
        for f in files:
            size = _size(f, skipped[split])
            if size is None:
                continue
            total += size
            digest.update(f"{split}\0{f.relpath}\0{f.label}\0{size}\n".encode())
            if f.fields:
                digest.update(f"{json.dumps(f.fields.to_json(), sort_keys=True)}\n".encode())
            path = f"{url.rstrip('/')}/{f.relpath}" if url else os.fspath(f.path)  # keeps an ArchiveMember
            tasks.append(Task(split, path, f.relpath, f.key, f.label, size, f.fields))
    digest.update("\0".join(layout.classes.classes).encode())
    return TaskList(list(layout.classes.classes), tasks, skipped, total, digest.hexdigest())


def list_tasks(src: str | Path, *, labels: str | Path | None = None, layout: str = "auto",
               split: str | None = None, shuffle_seed: int | None = None) -> TaskList:
    """Scan `src` (ImageNet layout, or flat with a labels CSV; a folder or an object-store prefix)
    and order what will be written. A folder holding ImageNet's downloaded archives (or Kaggle's
    ImageNet) is converted from them without extracting them (converters.imagenet); a Parquet file
    or a folder of them (the Hugging Face Hub's layout) row by row (converters.parquet); other tools'
    WebDataset shards (img2dataset's output folder, a brace pattern) member by member (converters.tar_shards)."""
    if labels is None and layout == "auto" and not is_url(src):
        shards = scan_tar_shards(src, split=split)  # before Parquet: img2dataset's .parquet sidecars hold no images
        if shards is not None:
            return tasks_from_layout(shards, shuffle_seed=shuffle_seed)
        rows = scan_parquet(src, split=split, shuffle_seed=shuffle_seed)  # shuffled by row group, not here
        if rows is not None:
            return tasks_from_layout(rows, shuffle_seed=None)
        download = scan_imagenet(src, split=split)
        if download is not None:
            return tasks_from_layout(download, shuffle_seed=shuffle_seed)
    if labels is not None:
        if is_url(src):
            raise ValueError(f"--labels needs a local folder; {redact(str(src))} is a URL. Lay the objects out as "
                             "SPLIT/CLASS/* or CLASS/*, or copy them to a disk")
        scanned = scan_labelled(src, labels, split=split or "val")
    else:
        scanned = only_split(scan_folder(src, layout=layout, split=split or "train"), split)
    return tasks_from_layout(scanned, shuffle_seed=shuffle_seed, url=str(src) if is_url(src) else None)


def only_split(scanned: FolderLayout, split: str | None) -> FolderLayout:
    """`scanned` cut to the one split asked for (its labels still index the train split's classes);
    all of it when none was asked for. A split the folder lacks is a ValueError naming those it has."""
    if split is None or list(scanned.splits) == [split]:
        return scanned
    if split not in scanned.splits:
        raise ValueError(f"--split {split!r}: {redact(str(scanned.root))} has the splits "
                         f"{', '.join(sorted(scanned.splits))}; pick one of them, or leave --split out to convert all")
    return dataclasses.replace(scanned, splits={split: scanned.splits[split]},
                               skipped={split: scanned.skipped.get(split, [])})


RECORD_OVERHEAD = 7 * 512  # a .wds sample's four tar headers and three small padded members


def record_bytes(task: Task) -> int:
    """The planned size of a task's .wds sample: its file, RECORD_OVERHEAD and, for a record with
    other fields, their JSON in its `.json` member and the caption's `.txt` member (header and bytes)."""
    if not task.fields:
        return task.size + RECORD_OVERHEAD
    extra = padded(len(json.dumps(task.fields.to_json(), separators=(",", ":"))) + len(',"fields":'))
    if task.fields.text is not None:
        extra += BLOCK + padded(len(task.fields.text.encode("utf-8")))
    return task.size + RECORD_OVERHEAD + extra


@dataclass(frozen=True)
class ShardJob:
    """One output shard fixed before any work starts: consecutive tasks of one split. `first` is the
    write position (within the split) of its first task; task k's record gets position first + k
    whatever earlier files turn out to be, so shards can be written in any order, anywhere."""

    split: str
    number: int
    first: int
    tasks: tuple[Task, ...]

    @property
    def name(self) -> str:
        return f"{self.split}-{self.number:06d}"

    @property
    def planned_bytes(self) -> int:
        return sum(map(record_bytes, self.tasks))


def shard_jobs(task_list: TaskList, shard_bytes: int) -> list[ShardJob]:
    """Cut each split's tasks, in write order, into shards of at most `shard_bytes` of input (each
    file's size plus its tar overhead; a larger file gets a shard of its own). Input sizes decide,
    not output sizes, so every engine and every retry cuts the same shards."""
    jobs: list[ShardJob] = []
    for split, group in itertools.groupby(task_list.tasks, key=lambda t: t.split):
        tasks, cuts, total = list(group), [0], 0
        for i, task in enumerate(tasks):
            size = record_bytes(task)
            if i > cuts[-1] and total + size > shard_bytes:
                cuts.append(i)
                total = 0
            total += size
        bounds = zip(cuts, cuts[1:] + [len(tasks)])
        jobs += [ShardJob(split, n, a, tuple(tasks[a:b])) for n, (a, b) in enumerate(bounds)]
    return jobs
