"""An image folder's file list as five flat arrays, memory-mapped from files every process shares.

A list of 1.28M `ImageFile` objects holds ~1 KB a record in every process that unpickles it (each
spawned DALI or DataLoader worker: ~1.3 GB each). These arrays hold ~50-80 bytes a record, written once
to a content-addressed folder (`<cache>/index/folder-<digest>/`) and memory-mapped: a worker is sent
the folder's path, and every process on the node reads the same page-cache copy. Where the cache
folder cannot be written, the arrays stay in memory (and are pickled whole: still ~15x smaller).
"""
from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from array import array
from typing import Any, Iterable

import numpy as np

FIELDS = ("names", "name_ends", "keys", "key_ends", "labels")


def _blob(items: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    ends = np.cumsum([len(b) for b in items], dtype=np.int64) if items else np.zeros(0, np.int64)
    return np.frombuffer(b"".join(items), dtype=np.uint8), ends


class FolderIndex:
    """Per record: its path relative to the folder (raw bytes, so names that are not UTF-8 survive),
    its key and its label."""

    def __init__(self, arrays: dict[str, np.ndarray], folder: Path | None = None) -> None:
        self.arrays, self.folder = arrays, folder

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
        h = hashlib.sha256()
        for field in FIELDS:
            h.update(field.encode())
            h.update(np.ascontiguousarray(self.arrays[field]).tobytes())
        return h.hexdigest()[:32]

    def shared(self, cache: Path) -> "FolderIndex":
        """This index memory-mapped from `cache/folder-<digest>/` (written there first if need be);
        itself when the folder cannot be written."""
        folder = cache / f"folder-{self.digest()}"
        try:
            if not (folder / "labels.npy").exists():
                tmp = cache / f".folder-{self.digest()}.{os.getpid()}.tmp"
                tmp.mkdir(parents=True, exist_ok=True)
                for field in FIELDS:
                    np.save(tmp / f"{field}.npy", self.arrays[field])
                try:
                    os.rename(tmp, folder)
                except OSError:  # another process published the same index first
                    shutil.rmtree(tmp, ignore_errors=True)
            return FolderIndex.mapped(folder)
        except OSError:
            return self

    @classmethod
    def mapped(cls, folder: Path) -> "FolderIndex":
        return cls({field: np.load(folder / f"{field}.npy", mmap_mode="r") for field in FIELDS}, folder)

    def __getstate__(self) -> dict[str, Any]:
        if self.folder is not None:  # a worker maps the same files: no copy of the records travels
            return {"folder": self.folder}
        return {"arrays": self.arrays, "folder": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        if state["folder"] is not None:
            self.__dict__.update(FolderIndex.mapped(state["folder"]).__dict__)
        else:
            self.arrays, self.folder = state["arrays"], None
