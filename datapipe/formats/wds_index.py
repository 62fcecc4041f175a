"""A `.wds` split's index: shard and index-file names, where each sample starts in its shard. Local:
`{split}.offsets.npy`, memory-mapped (every process and worker shares the page cache's copy). A URL:
each shard's starts walked from its own tar headers once the shard is in the cache (`ShardStarts`),
so opening fetches no per-record file. Written once, when a conversion finishes (`write_offsets`).
"""
from __future__ import annotations

import hashlib
import io
import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ..records import SplitInfo
from ..storage import Location
from ..storage.dataset_files import index_limit
from ..storage.durable import atomic_write
from .shard_table import ShardList
from .tar import BLOCK, END_OF_ARCHIVE, IDX_VERSION, sample_starts_from_headers

STARTS_HELD = 1 << 20  # a remote split's sample starts a process keeps, of the shards read last (<= 4 MiB)


def shard_name(split: str, number: int) -> str:
    return f"{split}-{number:06d}.tar"


def idx_name(tar: str) -> str:
    return tar[: -len(".tar")] + ".idx"


def offsets_name(split: str) -> str:
    return f"{split}.offsets.npy"


def sample_starts(idx_text: str, where: str = "index") -> np.ndarray:
    """Where each sample of a shard starts (its first member's header), from the shard's `.idx`."""
    lines = idx_text.splitlines()
    if not lines or not lines[0].startswith(IDX_VERSION):
        raise ValueError(f"{where}: not a DALI {IDX_VERSION} index (first line {lines[:1]!r})")
    try:
        starts = np.array([int(line.split(" ", 2)[1]) for line in lines[1:]], dtype=np.int64) - BLOCK
    except (IndexError, ValueError, OverflowError):
        starts = np.array([-1])
    if len(starts) and starts.min() < 0:
        raise ValueError(f"{where}: a line does not give a sample's offset in the tar; the index is damaged")
    return starts


class SpanIndex:
    """Record i -> (shard number, start, end) of its members; the shard boundaries from the split's
    shards (`shard_table.ShardList`). Where each sample starts: from `{split}.offsets.npy` through
    `opener`, memory-mapped and shared through the page cache (a pickled index carries `opener`, which
    maps it again, never the offsets); or, without one, per shard from `shard_starts` (a remote
    split's `ShardStarts`)."""

    def __init__(self, shards: ShardList, opener: Callable[[], np.ndarray] | None = None,
                 shard_starts: Callable[[int], np.ndarray] | None = None) -> None:
        self.shards = shards
        self.opener, self.shard_starts = opener, shard_starts
        self.starts = opener() if opener is not None else None
        if self.starts is not None and len(self.starts) != shards.records:
            raise ValueError(f"the offsets list {len(self.starts)} samples, the shards {shards.records}")

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "starts": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.starts = self.opener() if self.opener is not None else None

    def __len__(self) -> int:
        return self.shards.records

    def shard_of(self, index: int) -> int:
        return self.shards.shard_of(index)

    def span(self, index: int) -> tuple[int, int, int]:
        number = self.shard_of(index)
        first, last = self.shards.first(number), self.shards.first(number + 1)
        starts, at = (self.starts, index) if self.starts is not None else (self.shard_starts(number), index - first)
        start = int(starts[at])
        end = int(starts[at + 1]) if index + 1 < last else int(self.shards.entry(number)["bytes"]) - END_OF_ARCHIVE
        return number, start, end


class ShardStarts:
    """Shard number -> where its samples start, walked from the shard's own tar headers once it is in
    the shard cache: the cache checks each copy against the manifest's sha256, so these are as trusted
    as the bytes, and a remote split opens without fetching its offsets file (8 bytes a record). Each
    process keeps those of the shards it read last, at most STARTS_HELD besides the newest (4 bytes
    each below 4 GiB), shared by its threads; a pickled one carries none. A walk opens the shard
    through the cache itself (a thread's shard-file LRU is its own); a reader opens it through its
    LRU first (`WdsDataset._read`), so the walk pins no copy beyond those the LRU holds."""

    def __init__(self, location: Location, shards: ShardList) -> None:
        self.location, self.shards = location, shards  # each shard's name, samples, bytes, sha256
        self.__setstate__({})

    def __getstate__(self) -> dict[str, Any]:
        return {"location": self.location, "shards": self.shards}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._held: OrderedDict[int, np.ndarray] = OrderedDict()  # shard number -> its starts, oldest first
        self._count, self._lock, self._pid = 0, threading.Lock(), os.getpid()

    def __call__(self, number: int) -> np.ndarray:
        if self._pid != os.getpid():  # a forked child starts afresh: a lock held at the fork is never let go
            self.__setstate__({})
        with self._lock:
            if number in self._held:
                self._held.move_to_end(number)
                return self._held[number]
        entry = self.shards.entry(number)
        name, size = entry["name"], int(entry["bytes"])
        fd = self.location.open(name, size=size, sha256=entry.get("sha256"))
        try:
            found = sample_starts_from_headers(fd, size - END_OF_ARCHIVE, int(entry["samples"]),
                                               self.location.describe(name))
        finally:
            os.close(fd)
        starts = np.array(found, dtype=np.uint32 if size < 1 << 32 else np.int64)
        with self._lock:
            while self._held and self._count + len(starts) > STARTS_HELD:
                self._count -= len(self._held.popitem(last=False)[1])
            self._count += len(starts) - len(self._held.pop(number, ()))
            self._held[number] = starts
        return starts


def check_offsets_header(fh: Any, samples: int, where: str) -> int:
    """Refuse an offsets file that is not `samples` int64s filling the file: numpy would otherwise
    allocate whatever a crafted header claims before reading a byte. Returns where the offsets begin
    and leaves `fh` at its start."""
    size = os.fstat(fh.fileno()).st_size
    try:
        version = np.lib.format.read_magic(fh)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read(fh, max_header_size=4096)
    except ValueError as exc:
        raise ValueError(f"{where}: not an offsets file ({exc})") from None
    start = fh.tell()
    if dtype != np.dtype("<i8") or fortran or shape != (samples,) or start + 8 * samples != size:
        raise ValueError(f"{where}: its header describes {dtype} {shape} in {size:,} bytes, not the {samples:,} "
                         "offsets the manifest's shards hold; the dataset is damaged or was crafted")
    fh.seek(0)
    return start


def load_offsets(location: Location, split: str, info: SplitInfo, shards: ShardList) -> np.ndarray:
    """The split's offsets file of a local dataset, memory-mapped: every process on a node shares the
    one copy in the page cache, no private byte a record. From the shards' `.idx` files for datasets
    converted before there was one (slower: a parse of every index line, and the offsets in memory,
    8 bytes a record). The file's header is checked first."""
    samples = shards.records
    if info.index:
        name = info.index["name"]
        # a manifest without the index's size or digest (older, or crafted): checked for what it gives
        with os.fdopen(location.open(name, size=info.index.get("bytes"), sha256=info.index.get("sha256")),
                       "rb") as fh:
            start = check_offsets_header(fh, samples, location.describe(name))
            if not samples:
                return np.zeros(0, np.int64)
            return np.memmap(fh, dtype="<i8", mode="r", offset=start, shape=(samples,))  # mmap holds its own fd
    parts = [sample_starts(location.read_bytes(idx_name(s["name"]), limit=index_limit(_shard_bytes(location, s)),
                                               what="DALI index").decode("ascii", "replace"),
                           location.describe(idx_name(s["name"]))) for s in shards]
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def _shard_bytes(location: Location, shard: dict[str, Any]) -> int:
    """A shard's size as the manifest says it, and no more than its local file's (a crafted manifest's
    claim must not lift the bound on its index's read)."""
    claimed = int(shard.get("bytes") or 0)
    if location.remote:
        return claimed
    try:
        return min(claimed, location.file(shard["name"]).stat().st_size)
    except OSError:
        return 0


def write_offsets(folder: Path, split: str, shards: list[dict[str, Any]]) -> dict[str, Any]:
    """`{split}.offsets.npy` from the shards' `.idx` files (once, when the conversion finishes);
    returns its manifest entry (name, bytes, sha256)."""
    parts = [sample_starts((folder / idx_name(s["name"])).read_text(encoding="ascii")) for s in shards]
    name, blob = offsets_file(split, parts)
    with atomic_write(folder / name, needs=len(blob)) as fh:  # never through a link planted there
        fh.write(blob)
    return {"name": name, "bytes": len(blob), "sha256": hashlib.sha256(blob).hexdigest()}


def offsets_file(split: str, starts: list[np.ndarray] | list[list[int]]) -> tuple[str, bytes]:
    """The name and bytes of a split's offsets file, from each shard's sample starts in order."""
    buffer = io.BytesIO()
    parts = [np.asarray(s, dtype=np.int64) for s in starts]
    np.save(buffer, np.concatenate(parts) if parts else np.zeros(0, np.int64))
    return offsets_name(split), buffer.getvalue()
