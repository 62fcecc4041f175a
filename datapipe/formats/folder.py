"""A plain image folder (ImageNet layout) read in place: the bytes are the files' bytes."""
from __future__ import annotations

import os
from pathlib import Path

from ..records import Record, SplitNotFound
from ..scan import scan_folder
from ..storage.cachedir import default_cache_dir
from ..storage.isolate import call_in_child
from .base import Dataset
from .folder_index import FolderIndex

NAME = "folder"


def _scan(path: Path, split: str, cache: Path) -> tuple[FolderIndex, list[str]]:
    """The split's index (shared through `cache` where it can be written) and the class list."""
    layout = scan_folder(path, split=split)
    if split not in layout.splits:
        raise SplitNotFound(f"split {split!r} not in {path}; it has {sorted(layout.splits)}")
    return FolderIndex.from_files(path, layout.splits[split]).shared(cache), list(layout.classes.classes)


class FolderDataset(Dataset):
    """One split of `root/class/*` or `root/split/class/*`; records are not checksummed. The file
    list is a shared memory-mapped index (folder_index.py), so workers get no copy of it."""

    format = NAME
    validated = False

    def __init__(self, path: Path, split: str = "train", *, cache_dir: Path | None = None) -> None:
        # The scan holds ~1 KB a record of Python objects: it runs in a short-lived child, so the
        # rank's heap never grows by it (at 1.28M files it kept ~100 B a record after freeing them).
        self.index, classes = call_in_child(_scan, Path(path), split, (cache_dir or default_cache_dir()) / "index")
        super().__init__(path, split=split, classes=classes, size=len(self.index))

    def file_path(self, index: int) -> Path:
        return self.path / os.fsdecode(self.index.name(self._check(index)))

    def origin(self, index: int) -> str:
        return self.index.name(self._check(index)).decode("utf-8", "backslashreplace")

    def _read(self, index: int) -> Record:
        return Record(self.index.key(index), self.file_path(index).read_bytes(), self.index.label(index),
                      self.origin(index), "")
