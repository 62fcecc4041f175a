"""A plain image folder (ImageNet layout) read in place: the bytes are the files' bytes."""
from __future__ import annotations

import ctypes
import gc
import os
from pathlib import Path

from ..records import FIELD_NAMES, NO_FIELDS, Record, Sample, SplitNotFound
from ..storage.cachedir import default_cache_dir, own_folder
from .base import Dataset
from .folder_index import FolderIndex
from .scan import read_sidecars, scan_split_compact, sidecar_reader

NAME = "folder"


BIG_SCAN = 10_000  # files: below it what a scan leaves behind is under a MB, not worth a collection


def give_back_freed_memory(files: int) -> None:
    """Return the heap a scan of `files` files freed to the system (glibc and pymalloc keep it
    otherwise). Not a forked child for the scan: on Python 3.11 a fork while another thread (DALI's)
    holds the import lock can deadlock. The garbage collection (it halves what stays) only after a
    big scan: in a long-lived process it costs a tenth of a second and finalizes whatever garbage
    other code left (a torch DataLoader iterator's then waits 5 s a worker)."""
    if files >= BIG_SCAN:
        gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def index_cache(cache_dir: Path | None) -> Path | None:
    """`index/` in this user's cache folder (given or default), or None where none can be made (the
    index then stays in memory). A cache folder that others could change is refused (UnsafeCacheDir)."""
    try:
        return (own_folder(Path(cache_dir)) if cache_dir else default_cache_dir()) / "index"
    except OSError:
        return None


def _scan(path: Path, split: str, cache: Path | None) -> tuple[FolderIndex, list[str], tuple[str, ...]]:
    """The split's index (shared through `cache` where it can be written), the class list and the
    fields its images' sidecars carry (NAME.txt: "text", NAME.json: "meta")."""
    sidecars: set[str] = set()
    classes, splits, files = scan_split_compact(path, split, sidecars)
    if split not in splits:
        raise SplitNotFound(f"split {split!r} not in {path}; it has {splits}")
    index = FolderIndex.from_scan(files)
    del files  # the scan's lists go before the shared index's objects are made among them
    give_back_freed_memory(len(index))
    fields = tuple(name for name in FIELD_NAMES if name in sidecars)
    return index.shared(cache) if cache is not None else index, list(classes.classes), fields


class FolderDataset(Dataset):
    """One split of `root/class/*` or `root/split/class/*`; records are not checksummed. The file
    list is a shared memory-mapped index (folder_index.py), so workers get no copy of it. A caption
    `NAME.txt` and metadata `NAME.json` beside an image are read with its record (only the kinds the
    scan found in the split are looked for: the index holds nothing of them). Its fingerprint is its
    listing's (each file's relative path, key and label, in record order: the index's digest), so a
    resume position is refused once a file was renamed, moved, added or removed; its bytes are not read."""

    format = NAME
    validated = False

    def __init__(self, path: Path, split: str = "train", *, cache_dir: Path | None = None) -> None:
        self.index, classes, self.fields = _scan(Path(path), split, index_cache(cache_dir))
        give_back_freed_memory(len(self.index))  # and the index's in-memory arrays, now memory-mapped
        super().__init__(path, split=split, classes=classes, size=len(self.index))
        self.fingerprint = f"folder listing {self.index.digest()}"

    def file_path(self, index: int) -> Path:
        return self.path / os.fsdecode(self.index.name(self._check(index)))

    def origin(self, index: int) -> str:
        return self.index.name(self._check(index)).decode("utf-8", "backslashreplace")

    def __getitem__(self, index: int) -> Sample:
        index = self._check(index)  # the image and label only: a classification loader never reads a sidecar
        return Sample(self.index.key(index), self.file_path(index).read_bytes(), self.index.label(index))

    def _read(self, index: int) -> Record:
        path, origin = self.file_path(index), self.origin(index)
        fields = read_sidecars(str(path), origin, self.fields, sidecar_reader(self.path)) if self.fields else NO_FIELDS
        return Record(self.index.key(index), path.read_bytes(), self.index.label(index), origin, "", fields)
