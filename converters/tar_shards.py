"""`datapipe convert data/ out.lmdb` from WebDataset shards other tools wrote: img2dataset's output
(a folder of `00000.tar, 00001.tar, ...` beside their `.parquet` and `_stats.json` sidecars, which
are not shards and are not read), a brace pattern (`data/{00000..00009}.tar`) or one `.tar`.

The shards are indexed from their headers (datapipe.formats.tar, which trusts nothing it reads) and
each sample's image becomes a task whose path is an archive member (converters.members): workers
read its bytes with pread, as for ImageNet's tars. Its caption (`.txt`), metadata (`.json`) and
class ids (`.cls`: one, or several "3 7" / "3,7": multi-labels) are small: they are read here, at
scan, into `ImageFile.fields`, so the task list's fingerprint, the record digests and --resume cover them.
A sample without `.cls` has label -1; the classes are "0" .. the largest id, as when the shards are
read in place (datapipe.formats.wds_foreign); a `.cls` id at or past MAX_INFERRED_CLASSES (a damaged
or crafted label) skips its sample, so that list stays bounded. A shard cut short keeps the samples
before the damage (its last one dropped when it has fewer members than the one before: its caption
may be what was lost) and is reported in one line with its path; a sample without an image, whose caption, metadata
or class ids cannot be read, or two of whose members share an extension (`K.jpg`, `K.txt`, `K.jpg`:
datapipe.formats.tar.distinct_members) is skipped with its reason.
"""
from __future__ import annotations

import logging
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from datapipe.formats.tar import Component, samples_before_damage
from datapipe.formats.wds_foreign import IMAGE_EXTS, expand_shards, parse_cls, shard_folder
from datapipe.formats import field_text
from datapipe.errors import summary
from datapipe.records import ClassIndex, Fields, inferred_class_names, multi_labels
from datapipe.formats.scan import FolderLayout, ImageFile, make_key

from .imagenet import find_download
from .members import ArchiveMember

log = logging.getLogger(__name__)
SCAN_THREADS = 8  # shards indexed at once: header reads are small and scattered


@dataclass(frozen=True)
class ShardSample:
    """One sample of a shard as scanned: its key stem, image member (name, data offset, size) and
    what its small members hold."""

    stem: str
    image: tuple[str, int, int]
    text: str | None
    meta: str | None
    ids: tuple[int, ...] | None


def shard_paths(src: str | Path) -> list[str] | None:
    """The shards `src` names: one `.tar`, a brace pattern, or a folder holding only shards and their
    sidecars (not ImageNet's download folder: converters.imagenet reads that); None otherwise."""
    text = os.fspath(src)
    if text.endswith(".tar") and os.path.isfile(text):
        return [text]
    if "{" in text and not os.path.exists(text):
        return expand_shards(text)
    if os.path.isdir(text) and find_download(Path(text)) is None:
        return shard_folder(text)
    return None


def _read_fields(fd: int, found: dict[str, Component]) -> tuple[str | None, str | None, tuple[int, ...] | None]:
    """The caption (as written), canonical metadata and class ids of one sample (None where it has no
    such member); a ValueError naming the member that cannot be read as one (datapipe.formats.field_text)."""
    def member(ext: str) -> bytes | None:
        if ext not in found:
            return None
        _, offset, size, _ = found[ext]
        data = os.pread(fd, size, offset)
        if len(data) != size:
            raise ValueError(f"its .{ext} member ends past the shard's end")
        return data

    text, meta, ids = member("txt"), member("json"), member("cls")
    return (None if text is None else field_text.caption(text, "its .txt member", strip_newline=False),
            None if meta is None else field_text.metadata(meta, "its .json member"),
            None if ids is None else multi_labels(parse_cls(ids, "its .cls member")))


def scan_shard(shard: str, rel: str) -> tuple[list[ShardSample], list[dict[str, str]]]:
    """The samples of one shard, and what was skipped (members, samples, the damage) with reasons."""
    groups, refused, damage = samples_before_damage(shard)
    skipped = [{"path": rel, "reason": reason} for reason in refused]
    samples = []
    with open(shard, "rb") as fh:
        for components in groups:
            by_ext = {c[0]: c for c in components}
            image = next((by_ext[e] for e in IMAGE_EXTS if e in by_ext), None)
            stem = components[0][3].rsplit("/", 1)[-1].split(".", 1)[0]
            where = f"{rel}:{components[0][3]}"
            if image is None:
                skipped.append({"path": where, "reason": f"no image member ({'/'.join(IMAGE_EXTS)}); the sample "
                                                         f"has {summary(sorted(by_ext), 'member extension', show=5)}"})
                continue
            try:
                text, meta, ids = _read_fields(fh.fileno(), by_ext)
            except ValueError as exc:
                skipped.append({"path": f"{rel}:{image[3]}", "reason": str(exc)})
                continue
            samples.append(ShardSample(stem, (image[3], image[1], image[2]), text, meta, ids))
    if damage:
        what = damage[len(shard) + 2:] if damage.startswith(f"{shard}: ") else damage
        log.warning("%s: %s; the %d samples before it are kept", shard, what, len(samples))
        skipped.append({"path": rel, "reason": f"{what}; the {len(samples)} samples before it are kept"})
    return samples, skipped


def scan_tar_shards(src: str | Path, *, split: str | None = None) -> FolderLayout | None:
    """The shards `src` names (shard_paths) as a scanned folder of one split (`split`, default
    train), samples in shard and member order; None when `src` names no shards."""
    shards = shard_paths(src)
    if shards is None:
        return None
    root = Path(os.path.commonpath([os.path.dirname(os.path.abspath(s)) for s in shards]))
    rels = [Path(os.path.abspath(s)).relative_to(root).as_posix() for s in shards]
    log.info("%s: %d tar shard(s) of another tool (WebDataset layout)", src, len(shards))
    with ThreadPoolExecutor(min(SCAN_THREADS, len(shards))) as pool:
        scans = list(pool.map(scan_shard, shards, rels))
    multi = any(s.ids is not None and len(s.ids) > 1 for samples, _ in scans for s in samples)
    top = max((s.ids[-1] for samples, _ in scans for s in samples if s.ids), default=-1)
    files, skipped, taken = [], [], set()  # type: ignore[var-annotated]
    for shard, rel, (samples, bad) in zip(shards, rels, scans):
        skipped += bad
        for s in samples:
            name, offset, size = s.image
            labels = (s.ids or ()) if multi else None
            files.append(ImageFile(ArchiveMember(f"{shard}:{name}", shard, offset, size),  # type: ignore[arg-type]
                                   f"{rel}:{name}", s.ids[0] if s.ids else -1, make_key(s.stem, taken), size,
                                   Fields(s.text, s.meta, labels)))
    if top < 0:
        log.info("no sample has a .cls member: every record's label is -1 (image-text shards)")
    name = split or "train"
    return FolderLayout(root, ClassIndex(inferred_class_names(top)), {name: files}, {name: skipped})
