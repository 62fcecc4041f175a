"""A `.wds` split's shards, read without reading them all: `{split}.shards.bin` (manifest version 3).

A manifest listed every shard (name, samples, bytes, sha256: ~150 bytes of JSON each), so every
process parsed, checked and pickled the whole list: tens of MB and seconds at 400,000 shards. The
table is one fixed-width file beside the shards, in two columns of one row a shard:

    head     HEAD (magic, version, BLOCK_ROWS, shards, records), the record index where each block of
             BLOCK_ROWS rows starts (blocks + 1 int64, the last = records), and each block's sha256 in
             each column (blocks x 2 x 32 bytes)
    first    the record index of each shard's first sample (uint64): samples = the next one minus it
    rows     each shard's bytes (uint64), file number (uint32: the name is `{split}-{number:06d}.tar`,
             so a shard left out, all its files rejected, leaves a gap) and sha256 (32 bytes)

The manifest gives the table's size, sha256 and its head's sha256 (`head_sha256`), the shard count,
their total and largest size. A process reads the head (under 0.08 byte a shard; a count past
MAX_SHARDS is refused first, and a store's head comes READ_CHUNK at a time, a longer one only from an
object of the size the count implies) and checks it against the manifest, then each block it touches
against the head, once: memory-mapped from a local disk, by byte range from a store (only the blocks a
read needs, both columns' in one call, the last BLOCKS_HELD kept; the whole `first` column, 8 bytes a
shard, for shard-wise sampling). A pickled table is its
manifest entry and location. Datasets written before (version 1 and 2, the shards in the manifest) are read as they are
(`ListedShards`), through the same small interface (`ShardList`).
"""
from __future__ import annotations

import abc
import errno
import hashlib
import mmap
import os
import re
import struct
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from ..errors import OwnLineError
from ..records import SplitInfo
from ..storage import Location, StoreError
from ..storage.dataset_files import open_regular
from ..storage.verify import refuse_differing_files
from .tar import END_OF_ARCHIVE

MAGIC, TABLE_VERSION, BLOCK_ROWS = b"DPSHARDS", 1, 1024
HEAD = struct.Struct("<8sIIQQ")  # magic, version, block rows, shards, records
FIRST = np.dtype("<u8")
ROW = np.dtype([("bytes", "<u8"), ("number", "<u4"), ("sha256", "u1", (32,))])  # 44 bytes
ROW_FIELDS = struct.Struct("<QI32s")  # one row, unpacked (faster than a numpy record's fields)
BLOCKS_HELD = 64  # blocks of the table a process keeps (<= 2.8 MiB), besides the whole `first` column once read
MAX_SHARDS = 10 ** 9  # a shard's file number has at most nine digits (table_file's names): a head of <= 67 MiB
READ_CHUNK = 4 << 20  # the most bytes one ranged read of the head or the `first` column asks a store for


def table_name(split: str) -> str:
    return f"{split}.shards.bin"


class ShardTableDamaged(OwnLineError, StoreError, ValueError):
    """The shard table is not the one the manifest describes: the dataset is damaged (a ValueError, as
    for its other files), and the store or disk changed, not a record, so no backend serves around it
    (a StoreError)."""


class Layout:
    """Where the head and the two columns of a table of `shards` rows lie."""

    def __init__(self, shards: int) -> None:
        self.shards, self.blocks = shards, -(-shards // BLOCK_ROWS)
        self.head = HEAD.size + 8 * (self.blocks + 1) + 64 * self.blocks
        self.first_at = self.head
        self.rows_at = self.first_at + FIRST.itemsize * shards
        self.size = self.rows_at + ROW.itemsize * shards

    def span(self, column: int, block: int) -> tuple[int, int, int, int]:
        """(file offset, length, first row, end row) of `block` of `column` (0: first, 1: rows)."""
        lo, hi = block * BLOCK_ROWS, min((block + 1) * BLOCK_ROWS, self.shards)
        dtype, at = (FIRST, self.first_at) if column == 0 else (ROW, self.rows_at)
        return at + lo * dtype.itemsize, (hi - lo) * dtype.itemsize, lo, hi


def table_file(split: str, shards: list[dict[str, Any]]) -> tuple[str, bytes, dict[str, Any]]:
    """The name, bytes and manifest entry of a split's shard table, from its shards' manifest entries
    (name `{split}-NNNNNN.tar`, samples, bytes, sha256) in record order."""
    pattern = re.compile(re.escape(split) + r"-(\d{6,9})\.tar")
    numbers = [pattern.fullmatch(s["name"]) for s in shards]
    if not all(numbers) or not all(s.get("sha256") for s in shards):
        bad = next(s for s, m in zip(shards, numbers) if not m or not s.get("sha256"))
        raise ValueError(f"shard {bad.get('name')!r} of split {split!r}: a shard table holds shards named "
                         f"{split}-NNNNNN.tar with a sha256; write it with datapipe's writers")
    n, layout = len(shards), Layout(len(shards))
    samples = np.array([int(s["samples"]) for s in shards], dtype=np.uint64)
    first = np.concatenate([[0], np.cumsum(samples, dtype=np.uint64)]).astype(FIRST)
    rows = np.zeros(n, ROW)
    rows["bytes"] = [int(s["bytes"]) for s in shards]
    rows["number"] = [int(m[1]) for m in numbers]
    rows["sha256"] = np.frombuffer(bytes.fromhex("".join(s["sha256"] for s in shards)), np.uint8).reshape(n, 32)
    columns = (first[:-1].tobytes(), rows.tobytes())
    digests = []
    for b in range(layout.blocks):
        for column, blob in enumerate(columns):
            at, length, _, _ = layout.span(column, b)
            at -= layout.first_at if column == 0 else layout.rows_at
            digests.append(hashlib.sha256(blob[at:at + length]).digest())
    head = HEAD.pack(MAGIC, TABLE_VERSION, BLOCK_ROWS, n, int(first[-1])) + \
        np.append(first[:-1][::BLOCK_ROWS], first[-1]).astype(FIRST).tobytes() + b"".join(digests)
    blob = head + columns[0] + columns[1]
    sizes = rows["bytes"]
    entry = {"name": table_name(split), "bytes": len(blob), "sha256": hashlib.sha256(blob).hexdigest(),
             "head_sha256": hashlib.sha256(head).hexdigest(), "shards": n, "shard_bytes": int(sizes.sum()),
             "largest_shard": int(sizes.max()) if n else 0}
    return entry["name"], blob, entry


class ShardList(abc.ABC):
    """A split's shards in record order: `len`, `[k]` (its entry: name, samples, bytes, sha256),
    the record index each starts at, the shard holding a record, samples per shard, size totals;
    `location` holds the shard files, `source` names what gives their entries."""

    count: int
    records: int
    total_bytes: int
    largest: int
    location: Location | None = None
    source = "the manifest"

    @abc.abstractmethod
    def first(self, number: int) -> int:
        """The record index of shard `number`'s first sample (`records` for number == count)."""

    @abc.abstractmethod
    def shard_of(self, index: int) -> int:
        """The shard holding record `index`."""

    @abc.abstractmethod
    def entry(self, number: int) -> dict[str, Any]:
        """Shard `number`'s name, samples, bytes and sha256."""

    @abc.abstractmethod
    def sizes(self) -> np.ndarray:
        """Samples per shard (int64, `count` of them)."""

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, key: int | slice) -> Any:
        if isinstance(key, slice):
            return [self.entry(k) for k in range(*key.indices(self.count))]
        if not -self.count <= key < self.count:
            raise IndexError(f"shard {key} of {self.count}")
        return self.entry(key % self.count)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return (self.entry(k) for k in range(self.count))

    def verify_files(self, *, progress: bool = False) -> None:
        """What `datapipe verify` checks besides the records: each local shard file's size and sha256
        against its entry (`source` gives them), ValueError naming the first few that differ. A remote
        dataset's shards are checked as its cache fetches them."""
        if self.location is None or self.location.remote:
            return
        files = ((str(self.location.file(e["name"])), e["name"], int(e["bytes"]), e.get("sha256")) for e in self)
        refuse_differing_files(self.location.describe(), files, count=self.count, total=self.total_bytes,
                               what="shard", source=self.source, progress=progress)


class ListedShards(ShardList):
    """The shards a manifest of version 1 or 2 lists (datasets written before the table), as read then."""

    def __init__(self, shards: list[dict[str, Any]], location: Location | None = None) -> None:
        self.shards, self.location = shards, location
        self._first = np.concatenate([[0], np.cumsum([s["samples"] for s in shards], dtype=np.int64)])
        self.count, self.records = len(shards), int(self._first[-1])
        self.total_bytes = sum(int(s["bytes"]) for s in shards)
        self.largest = max((int(s["bytes"]) for s in shards), default=0)

    def first(self, number: int) -> int:
        return int(self._first[number])

    def shard_of(self, index: int) -> int:
        return int(np.searchsorted(self._first, index, side="right")) - 1

    def entry(self, number: int) -> dict[str, Any]:
        return self.shards[number]

    def sizes(self) -> np.ndarray:
        return np.diff(self._first)


class _Held:
    """One process's view of a table: its file mapped (local) or its store (remote), the head's
    fences and digests, the blocks read last, the `first` column once read whole."""

    def __init__(self, table: "ShardTable") -> None:
        self.table, self.lock = table, threading.Lock()
        self.blocks: OrderedDict[tuple[int, int], np.ndarray] = OrderedDict()
        self.column: np.ndarray | None = None
        self.map = None if table.location.remote else self._map()
        head = self._head()
        magic, version, rows, shards, records = HEAD.unpack_from(head)
        if (magic, version, rows, shards, records) != (MAGIC, TABLE_VERSION, BLOCK_ROWS, table.count, table.records):
            raise table.damaged(f"its head describes {shards:,} shards of {records:,} records (format {version}), "
                                f"the manifest {table.count:,} of {table.records:,}")
        blocks = table.layout.blocks
        self.fences = np.frombuffer(head, FIRST, blocks + 1, HEAD.size).astype(np.int64)
        self.digests = bytes(head[HEAD.size + 8 * (blocks + 1):])
        if self.fences[0] != 0 or self.fences[-1] != records or np.any(np.diff(self.fences) < 0):
            raise table.damaged("its block starts are not in record order")

    def _map(self) -> mmap.mmap | None:
        """The local table mapped, once its size is the manifest's; None where the process's address space
        cannot take it (ulimit -v): it is then read by pread, in chunks, as from a store."""
        table = self.table
        path = str(table.location.file(table.name))
        fd = open_regular(path, what="shard table", fix="re-convert the dataset")
        try:
            size = os.fstat(fd).st_size
            if size != table.layout.size:
                raise table.damaged(f"it is {size:,} bytes, the manifest says {table.layout.size:,}")
            return mmap.mmap(fd, size, access=mmap.ACCESS_READ)  # the map holds the file, not the descriptor
        except OSError as exc:
            if exc.errno != errno.ENOMEM:
                raise
            return None
        finally:
            os.close(fd)

    def _head(self) -> memoryview | bytearray:
        """The head, once its sha256 is the manifest's. Unmapped, in reads of at most READ_CHUNK;
        a head longer than one is read only from an object of the size the shard count implies (asked
        first): a crafted count costs one request, not the head it claims."""
        table, length = self.table, self.table.layout.head
        if self.map is not None:
            head: memoryview | bytearray = self.read(0, length)
        else:
            if table.location.remote and length > READ_CHUNK:  # a local one's size was checked at _map
                size = table.location.store.size(table.location.checked(table.name))
                if size != table.layout.size:
                    raise table.damaged(f"the manifest claims {table.count:,} shards, a table of {table.layout.size:,} "
                                        f"bytes; the store holds {'none' if size is None else f'{size:,} bytes'}")
            head = bytearray(length)
            for start, part in self.chunks(0, length, READ_CHUNK):
                head[start:start + len(part)] = part
        if hashlib.sha256(head).hexdigest() != table.described["head_sha256"]:
            raise table.damaged("its head differs from the manifest's head_sha256")
        return head

    def chunks(self, start: int, length: int, chunk: int) -> Iterator[tuple[int, memoryview | bytes]]:
        """(offset from `start`, bytes) of the `length` bytes at `start`, at most `chunk` at a time."""
        for at in range(0, length, chunk):
            yield at, self.read(start + at, min(chunk, length - at))

    def read(self, start: int, length: int) -> memoryview | bytes:
        return self.read_many([(start, length)])[0]

    def read_many(self, ranges: list[tuple[int, int]]) -> list[memoryview | bytes]:
        """The table's bytes in each (start, length) range: from the map, or by ranged GETs in one call."""
        if self.map is not None:
            return [memoryview(self.map)[start:start + length] for start, length in ranges]
        got = self.table.location.read_ranges(self.table.name, ranges)
        for (start, length), part in zip(ranges, got):
            if len(part) != length:
                raise self.table.damaged(f"it ends before byte {start + length:,}, the manifest says "
                                         f"{self.table.layout.size:,}")
        return got

    def checked(self, column: int, block: int, raw: memoryview | bytes) -> np.ndarray:
        """A block's rows once its bytes have the sha256 its head gives, in order, sizes past a tar's end."""
        at = 32 * (2 * block + column)
        _, _, lo, hi = self.table.layout.span(column, block)
        if hashlib.sha256(raw).digest() != self.digests[at:at + 32]:
            what = "record starts" if column == 0 else "sizes and digests"
            raise self.table.damaged(f"the {what} of shards {lo:,}-{hi - 1:,} differ from the sha256 its head gives")
        rows = np.frombuffer(raw, FIRST if column == 0 else ROW)
        if column == 0:
            rows = rows.view(np.int64)  # record indices: below 2**63 (the fences are checked at open)
            if rows[0] != self.fences[block] or rows[-1] > self.fences[block + 1] or np.any(np.diff(rows) < 0):
                raise self.table.damaged(f"the record starts of shards {lo:,}-{hi - 1:,} are not in order")
        elif np.any(rows["bytes"] < END_OF_ARCHIVE) or np.any(rows["bytes"] >= 1 << 53):
            raise self.table.damaged(f"a size of shards {lo:,}-{hi - 1:,} is not a tar's")
        return rows

    def block(self, column: int, block: int) -> np.ndarray:
        """Rows `block` of `column`, checked. From a store, a block's two columns come in one call (a
        read needs both: where the shard's records start, and its size and sha256 to open it)."""
        key = (column, block)
        with self.lock:
            if key in self.blocks:
                self.blocks.move_to_end(key)
                return self.blocks[key]
        wanted = [key] if self.map is not None else [(c, block) for c in (0, 1)]
        parts = self.read_many([self.table.layout.span(c, b)[:2] for c, b in wanted])
        got = {(c, b): self.checked(c, b, raw) for (c, b), raw in zip(wanted, parts)}
        with self.lock:
            self.blocks.update(got)
            for k in got:
                self.blocks.move_to_end(k)
            while len(self.blocks) > BLOCKS_HELD:
                self.blocks.popitem(last=False)
        return got[key]

    def whole_column(self) -> np.ndarray:
        """Every shard's first record (int64, 8 bytes a shard), each block checked: mapped, or read from a
        store READ_CHUNK at a time."""
        if self.column is None:
            layout, whole = self.table.layout, BLOCK_ROWS * FIRST.itemsize
            if self.map is not None and layout.shards:  # the map's pages: no copy
                column = np.frombuffer(self.read(layout.first_at, layout.rows_at - layout.first_at), FIRST).view(np.int64)
            else:  # from a store, whole blocks at most READ_CHUNK at a time, into one array
                column = np.empty(layout.shards, np.int64)
            step = max(1, READ_CHUNK // whole) * whole
            for at, raw in self.chunks(layout.first_at, layout.rows_at - layout.first_at, step):
                for b in range(at // whole, (at + len(raw) - 1) // whole + 1):
                    rows = self.checked(0, b, raw[b * whole - at:min((b + 1) * whole - at, len(raw))])
                    if self.map is None:
                        column[b * BLOCK_ROWS:b * BLOCK_ROWS + len(rows)] = rows
            self.column = column
        return self.column


class ShardTable(ShardList):
    """A split's shards from its table (manifest version 3): a process reads the head when it first
    uses the table (the opening one at once), then the blocks it needs. Pickled: the manifest's entry."""

    source = "the shard table"

    def __init__(self, location: Location, split: str, entry: dict[str, Any], *, records: int,
                 replaced: Callable[[], None] | None = None) -> None:
        self.location, self.split, self.described, self.records = location, split, dict(entry), int(records)
        self.replaced = replaced  # raises DatasetReplaced where the dataset was (formats.base.Identity.check)
        self.name, self.count = entry["name"], int(entry["shards"])
        self.total_bytes, self.largest = int(entry["shard_bytes"]), int(entry["largest_shard"])
        self.layout = Layout(self.count)
        if self.count > MAX_SHARDS:
            raise self.damaged(f"the manifest claims {self.count:,} shards, a table holds at most {MAX_SHARDS:,} (a "
                               "shard's number has nine digits)")
        if int(entry["bytes"]) != self.layout.size:
            raise self.damaged(f"the manifest gives it {int(entry['bytes']):,} bytes, {self.count:,} shards "
                               f"take {self.layout.size:,}")
        self._pid: int | None = None
        self._process()  # a damaged or replaced table fails here, at open

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_pid": None, "_held": None}

    def damaged(self, why: str) -> ShardTableDamaged:
        if self.replaced is not None:  # a local dataset re-converted in place says so, in its own words
            self.replaced()
        return ShardTableDamaged(f"{self.location.describe(self.name)}: {why}; the shard table is damaged or the "
                                 "dataset was replaced since its manifest was read: re-convert it, or reopen it")

    def _process(self) -> _Held:
        if self._pid != os.getpid():  # first use in this process (a forked child or a worker starts afresh)
            self._held = _Held(self)
            self._pid = os.getpid()
        return self._held

    def first(self, number: int) -> int:
        if number >= self.count:
            return self.records
        held = self._process()
        if held.column is not None:
            return int(held.column[number])
        return int(held.block(0, number // BLOCK_ROWS)[number % BLOCK_ROWS])

    def shard_of(self, index: int) -> int:
        held = self._process()
        if held.column is not None:
            return int(np.searchsorted(held.column, index, side="right")) - 1
        block = min(int(np.searchsorted(held.fences, index, side="right")) - 1, self.layout.blocks - 1)
        rows = held.block(0, block)
        return block * BLOCK_ROWS + int(np.searchsorted(rows, index, side="right")) - 1

    def entry(self, number: int) -> dict[str, Any]:
        if not 0 <= number < self.count:
            raise IndexError(f"shard {number} of {self.count}")
        size, file_number, digest = ROW_FIELDS.unpack_from(self._process().block(1, number // BLOCK_ROWS),
                                                           number % BLOCK_ROWS * ROW.itemsize)
        return {"name": f"{self.split}-{file_number:06d}.tar", "samples": self.first(number + 1) - self.first(number),
                "bytes": size, "sha256": digest.hex()}

    def sizes(self) -> np.ndarray:
        column = self._process().whole_column()
        return np.diff(column, append=np.int64(self.records))

    def check_file(self) -> None:
        """The whole file against the manifest's sha256, read READ_CHUNK at a time (`datapipe verify`)."""
        held, digest = self._process(), hashlib.sha256()
        for _, part in held.chunks(0, self.layout.size, READ_CHUNK):
            digest.update(part)
        if digest.hexdigest() != self.described["sha256"]:
            raise self.damaged("its sha256 differs from the manifest's")

    def verify_files(self, *, progress: bool = False) -> None:
        """The table whole (`check_file`), then each shard file against its row."""
        self.check_file()
        super().verify_files(progress=progress)


def shard_list(location: Location, split: str, info: SplitInfo,
               replaced: Callable[[], None] | None = None) -> ShardList:
    """The split's shards: its table (manifest version 3), else the manifest's list. `replaced`:
    raises where the dataset was replaced since it was opened (checked before a table is called damaged)."""
    if info.table:
        return ShardTable(location, split, info.table, records=info.samples, replaced=replaced)
    return ListedShards(info.shards, location)
