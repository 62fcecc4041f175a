"""WebDataset shards: `{split}-{NNNNNN}.tar` (USTAR, fixed mtime) plus a DALI index `.idx` per shard.

Each sample is four members in this order: `KEY.cls` (ASCII label), `KEY.jpg|png` (the bytes),
`KEY.i64` (record position and label as two little-endian int64: DALI reads them with
dtypes=INT64, as it cannot parse `.cls` digits; the position is the record's index unless the
converter rejected files before it, see `RecordPositions`), `KEY.json` (key, label, original path, sha256,
and the record's other fields when it has some); a record with a caption has a fifth, `KEY.txt` (the
caption as UTF-8, as img2dataset writes it, so webdataset and open_clip readers see it). The
`webdataset` library and DALI's `readers.webdataset` read the shards unchanged.

This module reads them by random access: `{split}.offsets.npy` holds where each sample starts in its
shard (8 bytes a record, memory-mapped, so every process and worker shares one copy), one pread
reads a sample's span and its members are parsed from their tar headers. The shards themselves
(samples, bytes, sha256 of each) are in `{split}.shards.bin`, read a block at a time
(`shard_table`; a manifest before version 3 lists them). Shards are opened through
a bounded LRU (`datapipe.storage.files`), from the disk or, for a URL, from the shard cache; a URL's
offsets file is never fetched: each shard's sample starts come from its own tar headers (`ShardStarts`).
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import summary
from ..image.headers import image_ext
from ..records import MANIFEST_NAME, TABLE_VERSION, Manifest, Record
from ..storage import Location
from ..storage.durable import atomic_write, open_own
from ..storage.files import MAX_OPEN, MAX_OPEN_CACHED, ShardFiles
from .base import (Dataset, DatasetReplaced, Identity, PerProcess, Writer, read_dir_manifest, record_from_meta,
                   record_meta, write_dir_manifest)
from .shard_table import ShardList, shard_list, table_file
from .tar import BLOCK, END_OF_ARCHIVE, IDX_VERSION, members, member_header, padded
from .wds_index import ShardStarts, SpanIndex, idx_name, load_offsets, shard_name, write_offsets

NAME = "wds"
SUFFIXES = (".wds",)
_NOT_IMAGE = ("cls", "i64", "json", "txt")  # a sample's members besides its image


class RecordPositions:
    """Dataset index -> record position, the id a record's `.i64` holds: its slot in the conversion's
    write order. Files the converter rejected keep their slot (the manifest's `skipped` entries carry it as
    `position`), so shards can be written in any order; with none rejected, position == index."""

    def __init__(self, skipped: list[dict[str, Any]]) -> None:
        self._gaps = np.array(sorted(int(s["position"]) for s in skipped if "position" in s), dtype=np.int64)
        self._shifted = self._gaps - np.arange(len(self._gaps))  # gap k sits after (gap - k) kept records

    def __call__(self, index: int) -> int:
        return index + int(np.searchsorted(self._shifted, index, side="right"))

    def index(self, position: int) -> int:
        """The dataset index of the record at `position` (what DALI's readers.webdataset reads from .i64)."""
        return position - int(np.searchsorted(self._gaps, position))


class WdsDataset(Dataset):
    """Random access into this project's shards: one pread per sample, shards opened through an LRU."""

    format = NAME
    shuffled_at_write = True  # `datapipe convert` shuffles a .wds before cutting shards (--seed)

    def __init__(self, path: Path | str, manifest: Manifest, split: str, *, location: Location | None = None) -> None:
        info = manifest.split(split)
        super().__init__(path, split=split, classes=manifest.classes, size=info.samples)
        self.location = location or Location.local(path)
        if not self.location.remote:  # a remote one is read through its cache by the manifest's sha256s
            self.identity = Identity.take(path, Path(path) / MANIFEST_NAME, manifest, read_manifest)
        self.fingerprint = manifest.content_digest(split)
        self.fields = tuple(info.fields)
        self.shards: ShardList = shard_list(self.location, split, info,
                                            None if self.identity is None else self.identity.check)
        if self.location.remote:  # each shard's starts from its own headers: no offsets file to fetch at open
            self.index = SpanIndex(self.shards, shard_starts=ShardStarts(self.location, self.shards))
        else:
            self.index = SpanIndex(self.shards, functools.partial(load_offsets, self.location, split, info,
                                                                  self.shards))
        if len(self.index) != info.samples:
            raise ValueError(f"{self.location.describe()}: the index of split {split!r} lists {len(self.index)} "
                             f"samples, the manifest {info.samples}; run `datapipe verify` or re-convert")
        self._where: dict[int, tuple[str, str]] = {}  # shard number -> its name, and as messages give it (a URL
        # redacted), once used
        self.positions = RecordPositions(info.skipped)
        self._files = PerProcess(functools.partial(ShardFiles, self._open_shard,
                                                   max_open=MAX_OPEN_CACHED if self.location.remote else MAX_OPEN))

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_where": {}}  # a worker names the shards it reads itself

    def _named(self, number: int) -> tuple[str, str]:
        name = self.shards.entry(number)["name"]
        return self._where.setdefault(number, (name, self.location.describe(name)))

    def _open_shard(self, number: int) -> int:
        s = self.shards.entry(number)
        fd = self.location.open(s["name"], size=s["bytes"], sha256=s.get("sha256"))
        if self.identity is not None:
            try:
                self.identity.check()  # after the open: the shard opened is the one the manifest describes
            except DatasetReplaced:
                os.close(fd)
                raise
        return fd

    def shard_entries(self) -> ShardList:
        """Each shard's entry (name, samples, bytes, sha256), read when asked for (`len`, `[k]`, iteration),
        and their totals (`total_bytes`, `largest`)."""
        return self.shards

    def shard_sizes(self) -> np.ndarray:
        """Samples per shard, in record order (for shard-wise sampling)."""
        return self.shards.sizes()

    def read_ahead(self, shards: list[int]) -> None:
        """Start fetching these shards (by number) if they are remote and not cached yet."""
        entries = [self.shards.entry(n) for n in shards]
        self.location.prefetch([(s["name"], s["bytes"], s.get("sha256")) for s in entries])

    def _read(self, index: int) -> Record:
        files = self._files.get()
        if self.index.shard_starts is not None:  # opened (the oldest let go) before its starts are walked:
            files.fd(self.index.shard_of(index))  # the walk pins no copy beyond those the LRU holds
        number, start, end = self.index.span(index)
        shard, where = self._where.get(number) or self._named(number)
        parts = members(files.pread(number, end - start, start), where)
        data = next((v for k, (_, v) in parts.items() if k not in _NOT_IMAGE), None)
        if data is None or not {"cls", "i64", "json"} <= parts.keys():
            has = summary(sorted(parts), "member extension", show=5)
            raise ValueError(f"{shard}: sample at byte {start} has {has}; the shard is damaged")
        record = record_from_meta(parts["json"][1], data)
        if parts["cls"][1] != str(record.label).encode():
            raise ValueError(f"{shard}: {record.key}.cls says {parts['cls'][1]!r}, its .json says {record.label}; "
                             "the shard is damaged")
        text = record.fields.text
        if parts.get("txt", (None, None))[1] != (None if text is None else text.encode("utf-8")):
            raise ValueError(f"{shard}: {record.key}.txt is not the caption its .json holds; the shard is damaged")
        raw = parts["i64"][1]
        stored = np.frombuffer(raw, dtype="<i8").tolist() if len(raw) == 16 else raw
        expected = [self.positions(index), record.label]
        if stored != expected:  # DALI's readers.webdataset takes its labels from here
            raise ValueError(f"{shard}: {record.key}.i64 says (position, label) = {stored}, the record is "
                             f"{expected}; the shard is damaged")
        return record


class ShardFile:
    """The open shard of one split: its file, its index lines so far, its byte and sample counts."""

    def __init__(self, folder: Path, split: str, number: int, offset: int = 0, lines: list[str] | None = None):
        self.name = shard_name(split, number)
        self.number = number
        self.path = folder / self.name
        # never through a link planted in a resumed staging folder (durable.open_own: O_NOFOLLOW)
        flags = os.O_RDWR if offset else os.O_WRONLY | os.O_CREAT | os.O_TRUNC
        self.file = os.fdopen(open_own(self.path, flags, what="shard"), "r+b" if offset else "wb")
        self.file.truncate(offset)
        self.digest = hashlib.sha256()
        if offset:  # a resumed shard: its kept bytes
            self.file.seek(0)
            for chunk in iter(functools.partial(self.file.read, 1 << 20), b""):
                self.digest.update(chunk)
        self.file.seek(offset)
        self.lines = list(lines or [])
        self.offset = offset

    def add_record(self, position: int, record: Record) -> None:
        """Append a record as its four members (five with a caption); `position` is its record id
        (see `RecordPositions`)."""
        ext = image_ext(record.data) or "jpg"  # stored bytes are JPEG or PNG (datapipe.image.decode decides)
        caption = [] if record.fields.text is None else [("txt", record.fields.text.encode("utf-8"))]
        self.add(record.key, [("cls", str(record.label).encode()), (ext, record.data),
                              ("i64", np.array([position, record.label], dtype="<i8").tobytes()),
                              ("json", record_meta(record)), *caption])

    def add(self, key: str, members: list[tuple[str, bytes]]) -> None:
        """Append one sample's members in one write; note each member's data offset for the index."""
        fields, parts = [], []
        for ext, payload in members:
            name = f"{key}.{ext}"
            parts += (member_header(name, len(payload)), payload, b"\0" * (-len(payload) % BLOCK))
            fields.append(f"{ext} {self.offset + BLOCK} {len(payload)} {name}")
            self.offset += BLOCK + padded(len(payload))
        blob = b"".join(parts)
        self.file.write(blob)
        self.digest.update(blob)
        self.lines.append(" ".join(fields))

    def discard(self) -> None:
        """Close and delete a shard that received no sample."""
        self.file.close()
        self.path.unlink()

    def finish(self) -> dict[str, Any]:
        self.file.write(b"\0" * END_OF_ARCHIVE)
        self.digest.update(b"\0" * END_OF_ARCHIVE)
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()
        idx = self.path.with_name(idx_name(self.name))
        tmp = idx.with_name(idx.name + ".tmp")  # renamed into place: an .idx that exists is whole, and so is its shard
        with os.fdopen(open_own(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, what="index"), "w", encoding="ascii") as fh:
            fh.write(f"{IDX_VERSION} {len(self.lines)}\n" + "".join(f"{l}\n" for l in self.lines))
        os.replace(tmp, idx)
        return {"name": self.name, "samples": len(self.lines), "bytes": self.path.stat().st_size,
                "sha256": self.digest.hexdigest()}


class WdsWriter(Writer):
    """Appends samples to the current shard of each split and rolls to a new one past `shard_bytes`."""

    def __init__(self, staging: Path, *, size_hint: int, shard_bytes: int) -> None:
        super().__init__(staging, size_hint=size_hint, shard_bytes=shard_bytes)
        self.shard_bytes = shard_bytes
        self._open: dict[str, ShardFile] = {}
        self.shards: dict[str, list[dict[str, Any]]] = {}

    def write(self, split: str, index: int, record: Record) -> None:
        shard = self._open.get(split)
        if shard is not None and shard.lines and shard.offset + len(record.data) > self.shard_bytes:
            self.shards.setdefault(split, []).append(shard.finish())
            shard = None
        if shard is None:
            shard = self._open[split] = ShardFile(self.staging, split, len(self.shards.get(split, [])))
        shard.add_record(index, record)

    def checkpoint(self) -> dict[str, Any]:
        state: dict[str, Any] = {"closed": self.shards, "open": {}}
        for split, shard in self._open.items():
            shard.file.flush()
            os.fsync(shard.file.fileno())
            state["open"][split] = {"number": shard.number, "offset": shard.offset, "lines": shard.lines}
        return json.loads(json.dumps(state))

    def restore(self, state: dict[str, Any], counts: dict[str, int]) -> None:
        self.shards = {k: list(v) for k, v in state.get("closed", {}).items()}
        for split, o in state.get("open", {}).items():
            self._open[split] = ShardFile(self.staging, split, o["number"], o["offset"], o["lines"])
        live = {s["name"] for shards in self.shards.values() for s in shards} | {o.name for o in self._open.values()}
        for stray in self.staging.glob("*.tar"):  # shards begun after the checkpoint
            if stray.name not in live:
                stray.unlink()
                stray.with_name(idx_name(stray.name)).unlink(missing_ok=True)
                stray.with_name(idx_name(stray.name) + ".tmp").unlink(missing_ok=True)

    def close(self, manifest: Manifest) -> None:
        for split, shard in self._open.items():
            self.shards.setdefault(split, []).append(shard.finish())
        self._open = {}
        for split, info in manifest.splits.items():
            shards = self.shards.get(split, [])
            info.index = write_offsets(self.staging, split, shards)
            name, blob, info.table = table_file(split, shards)
            with atomic_write(self.staging / name, needs=len(blob)) as fh:
                fh.write(blob)
        manifest.version = TABLE_VERSION
        write_dir_manifest(self.staging, manifest)

    def abort(self) -> None:
        for shard in self._open.values():
            shard.file.close()


read_manifest = read_dir_manifest
