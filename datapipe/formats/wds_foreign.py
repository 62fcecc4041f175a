"""WebDataset shards written by other tools: a brace pattern or a folder of shards, any image
extension, `.cls` labels (several ids, "3 7" or "3,7": multi-label) or none (label -1: img2dataset's
image-text shards), and `.txt` captions and `.json` metadata as the records' fields.

The index is built once from each shard's DALI `.idx` when one lies beside it, else from the tar
headers (tarfile seeks over the image data), reading only the small `.cls` members; it is kept as
NumPy arrays (28 bytes a record, and 12 for each of the caption, metadata and multi-label members
where some sample has one) in an uncompressed `.npz` under the user's cache folder, keyed by the
shards' names, sizes and modification times, and each open memory-maps them from there: every process
shares the page cache's copy (no private byte a record), and nothing is scanned again. A record's
caption and metadata are read (pread) with its image. Files beside the shards that are not `.tar`
(img2dataset's `.parquet` and `_stats.json` sidecars, DALI `.idx`) are not shards.
"""
from __future__ import annotations

import functools
import hashlib
import logging
import os
import re
import struct
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import quoted, shortened, summary
from ..names import check_name
from ..records import FIELD_NAMES, MAX_INFERRED_CLASSES, Fields, Record, Sample, inferred_class_names, multi_labels
from ..storage import default_cache_dir
from ..storage.cachedir import own_folder
from ..storage.dataset_files import index_limit, read_dataset_file
from ..storage.files import ShardFiles
from . import field_text
from .base import REOPEN, Dataset, DatasetReplaced, PerProcess
from .braces import shard_names
from .scan import is_image_name
from .tar import BLOCK, Component, distinct_members, member_name, parse_idx, samples_before_damage

log = logging.getLogger(__name__)
IMAGE_EXTS = ("jpg", "jpeg", "png", "webp", "bmp")
INDEX_VERSION = 3  # 2: `classes` and `shard_sizes`, so an open reads no per-record array; 3: fields, labels -1
FIELD_EXTS = {"text": "txt", "meta": "json", "labels": "cls"}  # a record field -> the member that holds it
_IDS = re.compile(r"[\s,]+")
_CAP_DIGITS = len(str(MAX_INFERRED_CLASSES))
_LOCAL_HEADER = struct.Struct("<4s22xHH")  # a zip member's local header: signature ... name and extra lengths


def expand_shards(pattern: str) -> list[str]:
    """`shards/train-{000000..000009}.tar` (or a list joined by '::', or a folder of shards) -> the
    existing shard paths. The pattern's names are counted before any is made (braces.shard_names)
    and refused past MAX_SHARDS; below it, they are made one at a time and the first that is no file
    stops the walk (a pattern of a million names, none there, is refused at once)."""
    if os.path.isdir(pattern):
        found = shard_folder(pattern)
        if not found:
            raise FileNotFoundError(f"{pattern} holds no .tar shards (or holds folders or images beside them)")
        return found
    count, names = shard_names(pattern)
    paths: list[str] = []
    for path in names:
        if not Path(path).is_file():
            raise FileNotFoundError(f"{quoted(pattern, 200)} names {count:,} shards and shard {len(paths) + 1}, "
                                    f"{quoted(path, 200)}, does not exist (check the pattern's ranges)")
        paths.append(path)
    return paths


def shard_folder(folder: str | Path) -> list[str] | None:
    """The `.tar` files of a folder of shards (img2dataset's output: shards beside `.parquet`,
    `_stats.json` and `.idx` files), sorted; None when it holds none, or subfolders or image files
    (an image folder)."""
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return None
    if any(e.is_dir() and not e.name.startswith(".") or is_image_name(e.name) for e in entries):
        return None
    return sorted(e.path for e in entries if e.name.endswith(".tar") and e.is_file()) or None


def parse_cls(raw: bytes, where: str) -> tuple[int, ...]:
    """The class ids a `.cls` member holds ("3", "3 7", "3,7"), in order; a ValueError naming it otherwise."""
    ids = [t for t in _IDS.split(raw.decode("ascii", "replace").strip()) if t]
    if not ids or not all(t.isdigit() for t in ids):
        raise ValueError(f"{where} holds {raw[:20]!r}, not class numbers (\"3\", or \"3 7\" for several)")
    big = next((t for t in ids if len(t.lstrip("0")) > _CAP_DIGITS or int(t) >= MAX_INFERRED_CLASSES), None)
    if big is not None:  # checked before int(): a 10^6-digit id is refused, not converted
        raise ValueError(f"{where} holds class id {shortened(big, 24)}, past the cap of {MAX_INFERRED_CLASSES:,} "
                         "classes for shards without a class list (datapipe.records.MAX_INFERRED_CLASSES); "
                         "the label is damaged or crafted")
    return tuple(int(t) for t in ids)


def _components(shard: str) -> list[list[Component]]:
    """The shard's samples, from its DALI `.idx` beside it (each member checked to lie inside the
    tar) or from its headers; a shard cut short (img2dataset's, killed mid-write) keeps the samples
    before the damage, with a warning naming it (convert lists it in the report). A sample two of whose
    members share an extension is left out with a warning naming both (tar.distinct_members)."""
    idx = Path(shard[: -len(".tar")] + ".idx") if shard.endswith(".tar") else None
    if idx is not None and idx.is_file():
        blob = read_dataset_file(str(idx), limit=index_limit(os.path.getsize(shard)), what="DALI index",
                                 links_out=True)  # a 300 MB sparse .idx cost GBs read whole
        try:
            text = (blob or b"").decode("ascii")
        except UnicodeDecodeError as exc:
            raise ValueError(f"{idx}: byte {exc.start} is not ASCII; not a DALI index (delete it: the shard is "
                             "then indexed from its headers)") from None
        samples, skipped = distinct_members(parse_idx(text, where=str(idx), shard_bytes=os.path.getsize(shard)))
        damage = None
    else:
        samples, skipped, damage = samples_before_damage(shard)
    if skipped:
        log.warning("%s: skipped %d tar member(s), first %s", shard, len(skipped), "; ".join(skipped[:3]))
    if damage:
        log.warning("%s; read in place, the %d samples before it are served and the rest of the shard is not",
                    damage, len(samples))
    return samples


def _class_ids(fd: int, member: Component | None, shard: str) -> tuple[int, ...]:
    """The class ids of a sample's `.cls` member (none without one); a ValueError naming it otherwise."""
    if member is None:
        return ()
    _, offset, size, name = member
    return multi_labels(parse_cls(os.pread(fd, size, offset), f"{shard}: {name}"))


def scan_index(pattern: str, shards: list[str]) -> dict[str, np.ndarray]:
    """Per sample: shard number, image member header offset, image size, label (-1 without a
    `.cls`, the first id with several); per field (FIELD_EXTS) the data offset and size of its member
    (-1, 0: none), kept only where some sample has one (an empty array otherwise). A sample whose
    `.cls` is not class ids under MAX_INFERRED_CLASSES is left out, with a warning a shard naming the
    first (so the class list "0" .. the largest id stays bounded)."""
    numbers, headers, sizes, labels, top = [], [], [], [], -1
    members: dict[str, tuple[list[int], list[int]]] = {name: ([], []) for name in FIELD_NAMES}
    multi = False
    for number, shard in enumerate(shards):
        bad: list[str] = []
        with open(shard, "rb") as fh:
            for components in _components(shard):
                found = {c[0]: c for c in components}
                image = next((found[e] for e in IMAGE_EXTS if e in found), None)
                if image is None:
                    has = summary(sorted(found), "member extension", show=5)
                    raise ValueError(f"{pattern}: sample {quoted(components[0][3])} in {shard} lacks an image "
                                     f"({'/'.join(IMAGE_EXTS)}); it has {has}")
                try:
                    ids = _class_ids(fh.fileno(), found.get("cls"), shard)
                except ValueError as exc:
                    bad.append(str(exc))
                    continue
                multi |= len(ids) > 1
                numbers.append(number)
                headers.append(image[1] - BLOCK)
                sizes.append(image[2])
                labels.append(ids[0] if ids else -1)
                top = max(top, ids[-1] if ids else -1)
                for field, (at, length) in members.items():
                    member = found.get(FIELD_EXTS[field])
                    at.append(member[1] if member else -1)
                    length.append(member[2] if member else 0)
        if bad:
            log.warning("skipped %d sample(s) whose .cls holds no usable class ids, the first: %s", len(bad), bad[0])
    keep = {"text": max(members["text"][0], default=-1) >= 0, "meta": max(members["meta"][0], default=-1) >= 0,
            "labels": multi}
    fields = {}
    for field, (at, length) in members.items():
        fields[f"{field}_at"] = np.array(at if keep[field] else [], np.int64)
        fields[f"{field}_size"] = np.array(length if keep[field] else [], np.int32)
    return {"shard": np.array(numbers, np.int32), "header": np.array(headers, np.int64),
            "size": np.array(sizes, np.int64), "label": np.array(labels, np.int64),
            "classes": np.array([top + 1], np.int64), **fields}


def build_index(pattern: str, shards: list[str]) -> dict[str, np.ndarray]:
    """scan_index's arrays, and the samples per shard (what an open needs, with the class count,
    without a pass over the samples)."""
    index = scan_index(pattern, shards)
    return {**index, "shard_sizes": np.bincount(index["shard"], minlength=len(shards)).astype(np.int64)}


def mapped_npz(file: Path) -> dict[str, np.ndarray]:
    """The arrays of an uncompressed `.npz` (np.savez), each memory-mapped where it lies in the zip;
    ValueError when a member is compressed or not a plain array."""
    arrays = {}
    with open(file, "rb") as fh, zipfile.ZipFile(fh) as zf:
        for info in zf.infolist():
            if info.compress_type != zipfile.ZIP_STORED or not info.filename.endswith(".npy"):
                raise ValueError(f"{file}: member {info.filename!r} is compressed or not an array")
            fh.seek(info.header_offset)
            signature, name_len, extra_len = _LOCAL_HEADER.unpack(fh.read(_LOCAL_HEADER.size))
            if signature != b"PK\x03\x04":
                raise ValueError(f"{file}: member {info.filename!r} has no local header")
            fh.seek(info.header_offset + _LOCAL_HEADER.size + name_len + extra_len)
            version = np.lib.format.read_magic(fh)
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, fortran, dtype = read(fh, max_header_size=4096)
            if fortran or dtype.hasobject or len(shape) != 1:
                raise ValueError(f"{file}: member {info.filename!r} is not a 1-D array of numbers")
            name, start = info.filename[: -len(".npy")], fh.tell()
            if start + shape[0] * dtype.itemsize > os.fstat(fh.fileno()).st_size:
                raise ValueError(f"{file}: member {info.filename!r} runs past the file's end")
            arrays[name] = (np.memmap(fh, dtype=dtype, mode="r", offset=start, shape=shape) if shape[0]
                            else np.zeros(0, dtype))
    return arrays


def cached_index(pattern: str, shards: list[str], cache_dir: Path | None = None) -> dict[str, np.ndarray]:
    """The index memory-mapped from the cache when the shards are unchanged, else built and cached
    (and kept in memory where it cannot be cached)."""
    h = hashlib.sha256(f"v{INDEX_VERSION}".encode())
    for shard in shards:
        h.update(f"{os.path.abspath(shard)}\0{stamp(shard)}\n".encode())
    # a given folder is checked as the default one is: this user's alone (an index planted there would be served)
    file = (own_folder(cache_dir) if cache_dir else default_cache_dir()) / "index" / f"{h.hexdigest()[:32]}.npz"
    try:
        return checked_index(mapped_npz(file), len(shards))
    except (OSError, ValueError, KeyError, zipfile.BadZipFile):
        pass
    index = build_index(pattern, shards)
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        tmp = file.with_name(f"{file.stem}.{os.getpid()}.tmp.npz")
        np.savez(tmp, **index)  # stored, not deflated: the next open maps it
        os.replace(tmp, file)
        return checked_index(mapped_npz(file), len(shards))
    except (OSError, ValueError, KeyError, zipfile.BadZipFile):  # a read-only home: the index stays in memory
        return index


def checked_index(index: dict[str, np.ndarray], shards: int) -> dict[str, np.ndarray]:
    """`index` when its arrays agree in length (KeyError or ValueError otherwise: it is rebuilt); a
    field's arrays are empty (no sample has it) or one entry a sample."""
    samples = len(index["label"])
    fields = [(len(index[f"{name}_at"]), len(index[f"{name}_size"])) for name in FIELD_NAMES]
    if any(len(index[k]) != samples for k in ("shard", "header", "size")) or len(index["shard_sizes"]) != shards \
            or len(index["classes"]) != 1 or not 0 <= int(index["classes"][0]) <= MAX_INFERRED_CLASSES \
            or any(a != b or a not in (0, samples) for a, b in fields):
        raise ValueError("the cached index's arrays disagree")
    return index


def index_fields(index: dict[str, np.ndarray]) -> tuple[str, ...]:
    """The FIELD_NAMES the index's samples carry (those whose arrays it kept)."""
    return tuple(name for name in FIELD_NAMES if len(index[f"{name}_at"]))


Stamp = tuple[int, int, int, int]


def stamp_of(st: os.stat_result) -> Stamp:
    """What says a shard is the one indexed: size, modification and change times, inode. A rewrite in
    place moves the change time, which no one can set back (cp -p, rsync -t and touch -r keep mtime);
    a replacement is another inode."""
    return st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino


def stamp(path: str) -> Stamp:
    return stamp_of(os.stat(path))


def open_indexed(paths: list[str], stamps: list[Stamp], number: int) -> int:
    """A read-only descriptor of shard `number`, refused when the file opened is not the one indexed."""
    fd = os.open(paths[number], os.O_RDONLY)
    st = os.fstat(fd)
    if stamp_of(st) != stamps[number]:
        os.close(fd)
        raise DatasetReplaced(f"the shard {paths[number]} was replaced or changed after this loader indexed it; {REOPEN}")
    return fd


class ForeignShardsDataset(Dataset):
    """Shards matching a pattern (or the shards of a folder), read by random access through the
    cached index. The class names are the label numbers ("0", "1", ...) since such shards carry no
    class list; none when no sample has a `.cls` (every label -1)."""

    format = "wds-shards"
    validated = False

    def __init__(self, pattern: str, *, cache_dir: Path | None = None) -> None:
        shards = expand_shards(pattern)
        self.shards = shards
        stamps = [stamp(shard) for shard in shards]  # before the index is read: a change while indexing shows
        self.index = cached_index(pattern, shards, cache_dir)
        classes = inferred_class_names(int(self.index["classes"][0]) - 1)  # checked_index: within the cap
        super().__init__(Path(shards[0]).parent, split="train", classes=classes, size=len(self.index["label"]))
        self.fields = index_fields(self.index)
        self._files = PerProcess(functools.partial(ShardFiles, functools.partial(open_indexed, shards, stamps)))

    def __getstate__(self) -> dict:
        """A spawned worker maps the cached index again: the arrays never travel."""
        mapped = isinstance(self.index["label"], np.memmap)
        return {**self.__dict__, "index": self.index["label"].filename} if mapped else self.__dict__

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        if isinstance(self.index, str):
            self.index = checked_index(mapped_npz(Path(self.index)), len(self.shards))

    def shard_sizes(self) -> np.ndarray:
        return self.index["shard_sizes"]

    def __getitem__(self, index: int) -> Sample:
        """The image and label only: a classification loader never reads a caption or metadata member
        (so a bad one fails record(index), not this)."""
        index = self._check(index)
        key, data, _, _ = self._image(index)
        return Sample(key, data, int(self.index["label"][index]))

    def _read(self, index: int) -> Record:
        key, data, number, path = self._image(index)
        files, shard = self._files.get(), self.shards[number]
        fields = Fields(*(self._field(files, number, index, field, f"{shard}: {key}.{FIELD_EXTS[field]}")
                          for field in FIELD_NAMES)) if self.fields else Fields()
        return Record(key, data, int(self.index["label"][index]), path, "", fields)

    def _image(self, index: int) -> tuple[str, bytes, int, str]:
        """Record `index`'s key, image bytes, shard number and `SHARD:MEMBER` path."""
        number, header, size = int(self.index["shard"][index]), int(self.index["header"][index]), int(self.index["size"][index])
        blob = self._files.get().pread(number, BLOCK + size, header)
        shard = self.shards[number]
        name = check_name(member_name(blob[:100].split(b"\0", 1)[0].decode("utf-8", "replace")),
                          f"{shard}: tar member name")
        return name.rsplit(".", 1)[0], blob[BLOCK:], number, f"{shard}:{name}"

    def _field(self, files: ShardFiles, number: int, index: int, field: str, where: str) -> Any:
        """Record `index`'s `field` read from its member (None when it has none): a caption as text,
        metadata as canonical JSON (datapipe.formats.field_text), labels as sorted ids; a ValueError naming the
        member otherwise."""
        if field not in self.fields or int(self.index[f"{field}_at"][index]) < 0:
            return () if field == "labels" and field in self.fields else None
        raw = files.pread(number, int(self.index[f"{field}_size"][index]), int(self.index[f"{field}_at"][index]))
        if field == "labels":
            return multi_labels(parse_cls(raw, where))
        if field == "meta":
            return field_text.metadata(raw, where)
        return field_text.caption(raw, where, strip_newline=False)
