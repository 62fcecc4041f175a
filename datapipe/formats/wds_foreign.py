"""WebDataset shards written by other tools: a brace pattern, `.cls` labels, any image extension.

The index is built once from each shard's DALI `.idx` when one lies beside it, else from the tar
headers (tarfile seeks over the image data), reading only the small `.cls` members; it is kept as
NumPy arrays (28 bytes a record) and cached under the user's cache folder, keyed by the shards'
names, sizes and modification times, so the next open loads it instead of scanning.
"""
from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path

import numpy as np

from ..names import check_name
from ..records import Record
from ..storage import default_cache_dir
from ..storage.cachedir import own_folder
from ..storage.files import ShardFiles
from .base import REOPEN, Dataset, DatasetReplaced, PerProcess
from .tar import BLOCK, Component, member_name, parse_idx, scan_tar

IMAGE_EXTS = ("jpg", "jpeg", "png", "webp", "bmp")
INDEX_VERSION = 1


def expand_shards(pattern: str) -> list[str]:
    """`shards/train-{000000..000009}.tar` (or a list joined by '::') -> the existing shard paths."""
    import braceexpand

    paths = [p for part in pattern.split("::") for p in braceexpand.braceexpand(part)]
    missing = [p for p in paths if not Path(p).is_file()]
    if missing:
        raise FileNotFoundError(f"{len(missing)} of {len(paths)} shards in {pattern!r} do not exist, e.g. {missing[0]}")
    return paths


def _components(shard: str) -> list[list[Component]]:
    """The shard's samples, from its DALI `.idx` beside it (each member checked to lie inside the
    tar) or from its headers."""
    idx = Path(shard[: -len(".tar")] + ".idx") if shard.endswith(".tar") else None
    if idx is not None and idx.is_file():
        try:
            text = idx.read_bytes().decode("ascii")
        except UnicodeDecodeError as exc:
            raise ValueError(f"{idx}: byte {exc.start} is not ASCII; not a DALI index (delete it: the shard is "
                             "then indexed from its headers)") from None
        return parse_idx(text, where=str(idx), shard_bytes=os.path.getsize(shard))
    return scan_tar(shard)


def build_index(pattern: str, shards: list[str]) -> dict[str, np.ndarray]:
    """Per sample: shard number, image member header offset, image size, label."""
    numbers, headers, sizes, labels = [], [], [], []
    for number, shard in enumerate(shards):
        with open(shard, "rb") as fh:
            for components in _components(shard):
                found = {c[0]: c for c in components}
                image = next((found[e] for e in IMAGE_EXTS if e in found), None)
                if "cls" not in found or image is None:
                    raise ValueError(f"{pattern}: sample {components[0][3]!r} in {shard} lacks a .cls label or an "
                                     f"image ({'/'.join(IMAGE_EXTS)}); it has {sorted(found)}")
                _, offset, size, _ = found["cls"]
                label = os.pread(fh.fileno(), size, offset).strip()
                if not label.isdigit():
                    raise ValueError(f"{shard}: {found['cls'][3]} holds {label[:20]!r}, not a class number")
                numbers.append(number)
                headers.append(image[1] - BLOCK)
                sizes.append(image[2])
                labels.append(int(label))
    return {"shard": np.array(numbers, np.int32), "header": np.array(headers, np.int64),
            "size": np.array(sizes, np.int64), "label": np.array(labels, np.int64)}


def cached_index(pattern: str, shards: list[str], cache_dir: Path | None = None) -> dict[str, np.ndarray]:
    """The index from the cache when the shards are unchanged, else built and cached."""
    h = hashlib.sha256(f"v{INDEX_VERSION}".encode())
    for shard in shards:
        h.update(f"{os.path.abspath(shard)}\0{stamp(shard)}\n".encode())
    # a given folder is checked as the default one is: this user's alone (an index planted there would be served)
    file = (own_folder(cache_dir) if cache_dir else default_cache_dir()) / "index" / f"{h.hexdigest()[:32]}.npz"
    try:
        with np.load(file) as cached:
            return {k: cached[k] for k in cached.files}
    except (OSError, ValueError, KeyError):
        pass
    index = build_index(pattern, shards)
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        tmp = file.with_name(f"{file.stem}.{os.getpid()}.tmp.npz")
        np.savez(tmp, **index)
        os.replace(tmp, file)
    except OSError:  # a read-only home: the index still works, it is just not kept
        pass
    return index


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
    """Shards matching a pattern, read by random access through the cached index. The class names
    are the label numbers ("0", "1", ...) since such shards carry no class list."""

    format = "wds-shards"
    validated = False

    def __init__(self, pattern: str, *, cache_dir: Path | None = None) -> None:
        shards = expand_shards(pattern)
        self.shards = shards
        stamps = [stamp(shard) for shard in shards]  # before the index is read: a change while indexing shows
        self.index = cached_index(pattern, shards, cache_dir)
        labels = self.index["label"]
        super().__init__(Path(shards[0]).parent, split="train",
                         classes=[str(c) for c in range(int(labels.max()) + 1 if len(labels) else 0)], size=len(labels))
        self._files = PerProcess(functools.partial(ShardFiles, functools.partial(open_indexed, shards, stamps)))

    def shard_sizes(self) -> np.ndarray:
        return np.bincount(self.index["shard"], minlength=len(self.shards))

    def _read(self, index: int) -> Record:
        number, header, size = int(self.index["shard"][index]), int(self.index["header"][index]), int(self.index["size"][index])
        blob = self._files.get().pread(number, BLOCK + size, header)
        shard = self.shards[number]
        name = check_name(member_name(blob[:100].split(b"\0", 1)[0].decode("utf-8", "replace")),
                          f"{shard}: tar member name")
        return Record(name.rsplit(".", 1)[0], blob[BLOCK:], int(self.index["label"][index]), f"{shard}:{name}", "")
