"""The small protocol every format implements: a random-access Dataset and a resumable Writer."""
from __future__ import annotations

import abc
import json
import os
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from ..errors import OwnLineError
from ..records import MANIFEST_NAME, Fields, Manifest, Record, Sample
from ..storage import Location, StoreError, redact
from ..storage.dataset_files import MANIFEST_MAX_BYTES, read_dataset_file
from ..storage.durable import atomic_write, fsync_file  # fsync_file: for the writers here and the converters
from ..storage.urls import is_url

T = TypeVar("T")


class PerProcess(Generic[T]):
    """A handle opened lazily, once per process, and never pickled: safe across DataLoader forks."""

    def __init__(self, opener: Callable[[], T]) -> None:
        self._opener = opener
        self._pid: int | None = None
        self._value: T | None = None

    def get(self) -> T:
        if self._pid != os.getpid():
            self._value = self._opener()
            self._pid = os.getpid()
        return self._value  # type: ignore[return-value]

    def __getstate__(self) -> dict[str, Any]:
        return {"_opener": self._opener, "_pid": None, "_value": None}


REOPEN = "restart the job, or recreate the loader, to read the new one"  # what to do when data changed under a loader


class DatasetReplaced(OwnLineError, StoreError):
    """The dataset at a path is no longer the one a loader opened (re-converted in place, removed):
    the store changed, not a record, so no backend serves around it (a StoreError). Raised where a
    process opens the data, never after reading it under the old manifest. Its one line survives a
    worker's traceback (errors.OwnLineError)."""


Signature = tuple[int, int, int, int]  # st_dev, st_ino, st_size, st_mtime_ns


def signature(path: str) -> Signature | None:
    """What changes when a file or folder is replaced (one stat); None when it is gone."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


@dataclass(frozen=True)
class Identity:
    """Which dataset was opened: its manifest's digest and the stat signature of its `anchor`, the file a
    re-conversion replaces (the converter renames a whole new output into place). Each process checks
    it when it opens the data, after the open: one stat; only when the signature differs is the
    manifest there read again (a copy of the same output is still the same dataset)."""

    root: str  # the dataset's path: named in the error, its manifest re-read
    anchor: str
    manifest: str  # Manifest.digest()
    stat: Signature | None
    read_manifest: Callable[[Path], Manifest | None]  # the format's reader of the manifest at `root`

    @classmethod
    def take(cls, root: Path | str, anchor: Path | str, manifest: Manifest,
             read_manifest: Callable[[Path], Manifest | None]) -> "Identity":
        return cls(str(root), str(anchor), manifest.digest(), signature(str(anchor)), read_manifest)

    def check(self, *, reread: bool = False) -> None:
        """DatasetReplaced unless `root` still holds the dataset opened. `reread`: compare the manifest
        even when the signature matches (open_dataset, once the reader is built)."""
        if not reread and self.stat is not None and signature(self.anchor) == self.stat:
            return
        try:
            now = self.read_manifest(Path(self.root))
        except (OSError, ValueError):
            now = None
        if now is None or now.digest() != self.manifest:
            raise DatasetReplaced(
                f"the dataset at {redact(self.root)} was replaced (re-converted) or removed after this loader opened "
                f"it; {REOPEN}")


class Dataset(abc.ABC):
    """One split of a dataset: `len(ds)`, `ds[i] -> Sample`, `ds.record(i) -> Record`, `ds.classes`."""

    format: str = ""
    validated = True  # every record passed `datapipe convert`'s checks (False: a folder, other tools' shards)
    shuffled_at_write = False  # records were shuffled across shards when written (datapipe's .wds)
    identity: Identity | None = None  # a packed local dataset's: checked where each process opens it
    fingerprint: str | None = None  # what resume positions point at (Manifest.content_digest); None: unknown
    fields: tuple[str, ...] = ()  # records.FIELD_NAMES its records carry beside image and label (record(i).fields)

    def __init__(self, path: Path | str, *, split: str, classes: list[str], size: int) -> None:
        self.path: Path | str = path if is_url(path) else Path(path)  # a URL stays a string
        self.location = Location.local(self.path)  # where its files are (a remote dataset sets its own)
        self.split = split
        self.classes = list(classes)
        self._size = size

    def __len__(self) -> int:
        return self._size

    def __getitem__(self, index: int) -> Sample:
        return self.record(index).sample

    def __iter__(self) -> Iterator[Sample]:
        for i in range(len(self)):
            yield self[i]

    def record(self, index: int) -> Record:
        """The stored record at `index` with its metadata (original path, digest)."""
        return self._read(self._check(index))

    def read_ahead(self, shards: list[int]) -> None:
        """A hint: these shards (by number) are read next. Remote sharded datasets start fetching them."""

    def neighbours(self, index: int) -> tuple[int, int]:
        """(first, count) of the records that may stand in for a bad record `index`: all of them."""
        return 0, len(self)

    def origin(self, index: int) -> str:
        """Where record `index` came from (its original relative path), for messages."""
        return self.record(index).path

    def _check(self, index: int) -> int:
        """`index` made non-negative, or an IndexError."""
        if index < 0:
            index += self._size
        if not 0 <= index < self._size:
            raise IndexError(f"index {index} out of range for split {self.split!r} of {self._size} records")
        return index

    @abc.abstractmethod
    def _read(self, index: int) -> Record:
        """Read record `index` (already bounds-checked)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({redact(self.path)!r}, split={self.split!r}, records={len(self)})"


class Writer(abc.ABC):
    """Writes one packed dataset into a staging folder.

    Resumable: `checkpoint()` makes everything written so far durable and returns a JSON-able state;
    after a crash, a new writer on the same staging folder gets `restore(state, counts)` and drops
    whatever was written after that checkpoint. `close(manifest)` writes the manifest last.
    """

    def __init__(self, staging: Path, *, size_hint: int, shard_bytes: int) -> None:
        self.staging = Path(staging)
        self.staging.mkdir(parents=True, exist_ok=True)

    @property
    def payload(self) -> Path:
        """What becomes the destination once complete (the staging folder itself by default)."""
        return self.staging

    @abc.abstractmethod
    def write(self, split: str, index: int, record: Record) -> None:
        """Store `record` as record number `index` of `split` (indices arrive in order from 0)."""

    @abc.abstractmethod
    def checkpoint(self) -> dict[str, Any]:
        """Make everything written durable; return the state `restore` needs."""

    @abc.abstractmethod
    def restore(self, state: dict[str, Any], counts: dict[str, int]) -> None:
        """Roll back to a checkpoint: keep exactly counts[split] records of each split."""

    @abc.abstractmethod
    def close(self, manifest: Manifest) -> None:
        """Flush, write the manifest last, release files."""

    def abort(self) -> None:
        """Release files without finishing (the staging folder stays for --resume)."""


def write_atomic(path: Path, blob: bytes) -> None:
    """Write bytes to path so a crash leaves either the old file or the new one, never half of one."""
    with atomic_write(path, needs=len(blob)) as fh:
        fh.write(blob)


def write_json_atomic(path: Path, text: str) -> None:
    write_atomic(path, text.encode("utf-8"))


def read_dir_manifest(path: Path) -> Manifest | None:
    """The manifest of a folder-shaped dataset, or None when the folder has none."""
    file = Path(path) / MANIFEST_NAME  # a FIFO or a link to /dev/zero there: one line, no hang, no read
    raw = read_dataset_file(str(file), limit=MANIFEST_MAX_BYTES, what="manifest", links_out=True)
    return None if raw is None else Manifest.from_json(raw.decode("utf-8"), source=str(file))


def write_dir_manifest(path: Path, manifest: Manifest) -> None:
    write_json_atomic(Path(path) / MANIFEST_NAME, manifest.to_json())


_META_LEN = struct.Struct("<I")


def pack_record(record: Record) -> bytes:
    """One record as bytes: 4-byte length of the JSON metadata, the metadata, the image bytes."""
    meta = record_meta(record)
    return _META_LEN.pack(len(meta)) + meta + record.data


def unpack_record(blob: bytes) -> Record:
    (n,) = _META_LEN.unpack_from(blob)
    start = _META_LEN.size
    return record_from_meta(blob[start:start + n], blob[start + n:])


def record_meta(record: Record) -> bytes:
    """The JSON metadata stored beside a record's bytes (everything but the bytes)."""
    body = {"key": record.key, "label": record.label, "path": record.path, "sha256": record.sha256}
    if record.fields:
        body["fields"] = record.fields.to_json()
    return json.dumps(body, separators=(",", ":")).encode()


def record_from_meta(meta: bytes, data: bytes) -> Record:
    m = json.loads(meta)
    return Record(m["key"], data, int(m["label"]), m["path"], m["sha256"], Fields.from_json(m.get("fields")))
