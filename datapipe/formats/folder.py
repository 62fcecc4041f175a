"""A plain image folder (ImageNet layout) read in place: the bytes are the files' bytes."""
from __future__ import annotations

from pathlib import Path

from ..records import Record, SplitNotFound
from ..scan import ImageFile, scan_folder
from .base import Dataset

NAME = "folder"


class FolderDataset(Dataset):
    """One split of `root/class/*` or `root/split/class/*`; records are not checksummed."""

    format = NAME
    validated = False

    def __init__(self, path: Path, split: str = "train") -> None:
        layout = scan_folder(path, split=split)
        if split not in layout.splits:
            raise SplitNotFound(f"split {split!r} not in {path}; it has {sorted(layout.splits)}")
        self.files: list[ImageFile] = layout.splits[split]
        super().__init__(path, split=split, classes=list(layout.classes.classes), size=len(self.files))

    def origin(self, index: int) -> str:
        return self.files[self._check(index)].relpath

    def _read(self, index: int) -> Record:
        f = self.files[index]
        return Record(f.key, f.path.read_bytes(), f.label, f.relpath, "")
