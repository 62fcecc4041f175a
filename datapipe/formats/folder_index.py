"""An image folder's file list as five flat arrays, memory-mapped from files every process shares.

A list of 1.28M `ImageFile` objects holds ~1 KB a record in every process that unpickles it (each
spawned DALI or DataLoader worker: ~1.3 GB each). These arrays hold ~50-80 bytes a record, written once
to a content-addressed folder (`<cache>/index/folder-<digest>/`) and memory-mapped: a worker is sent
the folder's path, and every process on the node reads the same page-cache copy. Where the cache
folder cannot be written, the arrays stay in memory (and are pickled whole: still ~15x smaller).

The folder's name is the digest of the arrays (their dtypes, shapes and bytes), and every process
that maps it, but the one that just wrote it, computes that digest again from what it mapped: a
folder planted there, damaged or left by another listing is never read. The scanning process then
rebuilds it from its scan; a worker, sent only the path, refuses it. For ImageNet's 1.28M files (84
MiB of arrays) the check costs ~75 ms per process (docs/cache.md).
"""
from __future__ import annotations

import hashlib
import logging
import os
import shutil
from array import array
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np

FIELDS = ("names", "name_ends", "keys", "key_ends", "labels")
log = logging.getLogger(__name__)


def _blob(items: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    ends = np.cumsum([len(b) for b in items], dtype=np.int64) if items else np.zeros(0, np.int64)
    return np.frombuffer(b"".join(items), dtype=np.uint8), ends


def arrays_digest(arrays: Mapping[str, np.ndarray]) -> str:
    """sha256 over each field's dtype, shape and bytes (read in place: a mapped file is not copied)."""
    h = hashlib.sha256()
    for field in FIELDS:
        a = np.ascontiguousarray(arrays[field])
        h.update(f"{field} {a.dtype.str} {a.shape}\n".encode())
        h.update(memoryview(a).cast("B"))
    return h.hexdigest()[:32]


def _discard(folder: Path) -> None:
    """Move a bad index folder out of the way, then delete it (processes mapping it keep their pages)."""
    aside = folder.with_name(f".{folder.name}.{os.getpid()}.bad")
    try:
        os.rename(folder, aside)
    except FileNotFoundError:  # another process discarded it first
        return
    shutil.rmtree(aside, ignore_errors=True)


class FolderIndex:
    """Per record: its path relative to the folder (raw bytes, so names that are not UTF-8 survive),
    its key and its label."""

    def __init__(self, arrays: dict[str, np.ndarray], folder: Path | None = None, digest: str | None = None) -> None:
        self.arrays, self.folder, self._digest = arrays, folder, digest

    @classmethod
    def from_scan(cls, entries: Iterable[tuple[bytes, str, int]]) -> "FolderIndex":
        """From scan_split_compact's (name, key, label) per file."""
        names: list[bytes] = []
        keys: list[bytes] = []
        labels = array("i")
        for name, key, label in entries:
            names.append(name)
            keys.append(key.encode("ascii"))
            labels.append(label)
        names_blob, name_ends = _blob(names)
        del names
        keys_blob, key_ends = _blob(keys)
        return cls({"names": names_blob, "name_ends": name_ends, "keys": keys_blob, "key_ends": key_ends,
                    "labels": np.array(labels, dtype=np.int32)})

    def __len__(self) -> int:
        return len(self.arrays["labels"])

    def _item(self, field: str, index: int) -> bytes:
        ends = self.arrays[f"{field[:-1]}_ends"]
        start = int(ends[index - 1]) if index else 0
        return self.arrays[field][start:int(ends[index])].tobytes()

    def name(self, index: int) -> bytes:
        """The file's path relative to the folder, as the filesystem spells it."""
        return self._item("names", index)

    def key(self, index: int) -> str:
        return self._item("keys", index).decode("ascii")

    def label(self, index: int) -> int:
        return int(self.arrays["labels"][index])

    def digest(self) -> str:
        if self._digest is None:
            self._digest = arrays_digest(self.arrays)
        return self._digest

    def shared(self, cache: Path) -> "FolderIndex":
        """This index memory-mapped from `cache/folder-<digest>/` (written there first, or again where
        what is there does not hold this index); itself when the folder cannot be written."""
        digest = self.digest()
        folder = cache / f"folder-{digest}"
        try:
            if folder.exists():
                try:
                    return FolderIndex.mapped(folder, digest)
                except ValueError as exc:
                    log.warning("%s: rebuilt from the scan", exc)
                    _discard(folder)
            tmp = cache / f".folder-{digest}.{os.getpid()}.tmp"
            tmp.mkdir(parents=True, exist_ok=True)
            for field in FIELDS:
                np.save(tmp / f"{field}.npy", self.arrays[field])
            try:
                os.rename(tmp, folder)
            except OSError:  # another process published the same index first: checked as found
                shutil.rmtree(tmp, ignore_errors=True)
                return FolderIndex.mapped(folder, digest)
            return FolderIndex.mapped(folder, digest, check=False)  # what this process just wrote
        except (OSError, ValueError):
            return self

    @classmethod
    def mapped(cls, folder: Path, digest: str, *, check: bool = True) -> "FolderIndex":
        """The index in `folder`, memory-mapped; ValueError unless what it holds has `digest` (`check`)."""
        try:
            arrays = {field: np.load(folder / f"{field}.npy", mmap_mode="r") for field in FIELDS}
        except (OSError, ValueError) as exc:
            raise ValueError(f"the folder index {folder} cannot be read ({exc})") from None
        if check and arrays_digest(arrays) != digest:
            raise ValueError(f"the folder index {folder} does not hold the listing it was made from (its "
                             f"digest is not {digest}): it was changed or planted there")
        return cls(arrays, folder, digest)

    def __getstate__(self) -> dict[str, Any]:
        if self.folder is not None:  # a worker maps the same files: no copy of the records travels
            return {"folder": self.folder, "digest": self.digest()}
        return {"arrays": self.arrays, "folder": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        if state["folder"] is None:
            self.arrays, self.folder, self._digest = state["arrays"], None, None
            return
        try:
            self.__dict__.update(FolderIndex.mapped(state["folder"], state["digest"]).__dict__)
        except ValueError as exc:
            raise ValueError(f"{exc} after the dataset was opened; open the dataset again (its folder is "
                             "scanned anew)") from None
