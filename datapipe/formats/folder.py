"""A plain image folder (ImageNet layout) read in place: the bytes are the files' bytes."""
from __future__ import annotations

import os
from pathlib import Path

from ..records import Record, SplitNotFound
from ..scan import scan_folder
from ..storage.cachedir import default_cache_dir
from .base import Dataset
from .folder_index import FolderIndex

NAME = "folder"


class FolderDataset(Dataset):
    """One split of `root/class/*` or `root/split/class/*`; records are not checksummed. The file
    list is a shared memory-mapped index (folder_index.py), so workers get no copy of it."""

    format = NAME
    validated = False

    def __init__(self, path: Path, split: str = "train", *, cache_dir: Path | None = None) -> None:
        layout = scan_folder(path, split=split)
        if split not in layout.splits:
            raise SplitNotFound(f"split {split!r} not in {path}; it has {sorted(layout.splits)}")
        built = FolderIndex.from_files(Path(path), layout.splits[split])
        self.index = built.shared((cache_dir or default_cache_dir()) / "index")
        super().__init__(path, split=split, classes=list(layout.classes.classes), size=len(self.index))

    def file_path(self, index: int) -> Path:
        return self.path / os.fsdecode(self.index.name(self._check(index)))

    def origin(self, index: int) -> str:
        return self.index.name(self._check(index)).decode("utf-8", "backslashreplace")

    def _read(self, index: int) -> Record:
        return Record(self.index.key(index), self.file_path(index).read_bytes(), self.index.label(index),
                      self.origin(index), "")
