"""WebDataset shards: `{split}-{NNNNNN}.tar` (USTAR, fixed mtime) plus a DALI index `.idx` per shard.

Each sample is four members in this order: `KEY.cls` (ASCII label), `KEY.jpg|png` (the bytes),
`KEY.i64` (record index and label as two little-endian int64: DALI reads them with
dtypes=INT64, as it cannot parse `.cls` digits), `KEY.json` (key, label, original path, sha256). The `webdataset` library and DALI's
`readers.webdataset` read the shards unchanged; this module reads them by random access through
the `.idx` offsets (one pread per sample).
"""
from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from ..records import Manifest, Record
from .base import Dataset, PerProcess, Writer, read_dir_manifest, record_from_meta, record_meta, write_dir_manifest

NAME = "wds"
SUFFIXES = (".wds",)
IDX_VERSION = "v1.2"
BLOCK = 512
MTIME = 946684800  # 2000-01-01: fixed so identical input gives identical shards


def shard_name(split: str, number: int) -> str:
    return f"{split}-{number:06d}.tar"


def idx_name(tar: str) -> str:
    return tar[: -len(".tar")] + ".idx"


def member_header(name: str, size: int) -> bytes:
    """A USTAR header for a regular file (mode 644, uid/gid 0, fixed mtime): what
    `tarfile.TarInfo.tobuf(USTAR_FORMAT)` writes, at a fraction of its cost on the write path."""
    raw = name.encode("ascii")
    if len(raw) > 100:
        raise ValueError(f"member name {name!r} is longer than USTAR's 100 bytes")
    head = b"".join((raw.ljust(100, b"\0"), b"0000644\0", b"0000000\0", b"0000000\0", b"%011o\0" % size,
                     b"%011o\0" % MTIME, b" " * 8, b"0", b"\0" * 100, b"ustar\x0000", b"\0" * 32, b"\0" * 32,
                     b"\0" * 16, b"\0" * 155)).ljust(BLOCK, b"\0")
    checksum = b"%06o\0 " % sum(head)
    return head[:148] + checksum + head[156:]


def parse_idx(text: str) -> list[list[tuple[str, int, int, str]]]:
    """DALI index lines -> per sample, its components as (ext, offset, size, member name)."""
    lines = text.splitlines()
    if not lines or not lines[0].startswith(IDX_VERSION):
        raise ValueError(f"not a DALI {IDX_VERSION} index (first line {lines[:1]!r})")
    samples = []
    for line in lines[1:]:
        f = line.split()
        samples.append([(f[i], int(f[i + 1]), int(f[i + 2]), f[i + 3]) for i in range(0, len(f), 4)])
    return samples


class ShardIndex:
    """Where every sample of a split lies: shard number and the byte span of its members."""

    def __init__(self, folder: Path, shards: list[str]) -> None:
        self.shards = [str(folder / s) for s in shards]
        spans, ext_of = [], []
        for number, shard in enumerate(self.shards):
            for components in parse_idx(Path(idx_name(shard)).read_text(encoding="ascii")):
                exts = {c[0]: c for c in components}
                spans.append((number, components[0][1] - BLOCK, components[-1][1] + components[-1][2]))
                ext_of.append(exts)
        self.spans = np.array(spans, dtype=np.int64).reshape(-1, 3)
        self.members = ext_of

    def __len__(self) -> int:
        return len(self.spans)


def _open_fds(shards: list[str]) -> list[int]:
    return [os.open(s, os.O_RDONLY) for s in shards]


def split_members(blob: bytes, start: int, components: dict[str, tuple[str, int, int, str]]) -> dict[str, bytes]:
    return {ext: blob[off - start: off - start + size] for ext, (_, off, size, _) in components.items()}


class WdsDataset(Dataset):
    """Random access into this project's shards (one pread per sample through the `.idx` files)."""

    format = NAME

    def __init__(self, path: Path, manifest: Manifest, split: str) -> None:
        info = manifest.split(split)
        super().__init__(path, split=split, classes=manifest.classes, size=info.samples)
        self.index = ShardIndex(Path(path), [s["name"] for s in info.shards])
        if len(self.index) != info.samples:
            raise ValueError(f"{path}: the .idx files of split {split!r} list {len(self.index)} samples, "
                             f"the manifest {info.samples}; run `datapipe verify` or re-convert")
        self._fds = PerProcess(functools.partial(_open_fds, self.index.shards))

    def _read(self, index: int) -> Record:
        number, start, end = (int(v) for v in self.index.spans[index])
        blob = os.pread(self._fds.get()[number], end - start, start)
        parts = split_members(blob, start, self.index.members[index])
        data = next(v for k, v in parts.items() if k not in ("cls", "i64", "json"))
        record = record_from_meta(parts["json"], data)
        if parts["cls"] != str(record.label).encode():
            raise ValueError(f"{self.index.shards[number]}: {record.key}.cls says {parts['cls']!r}, "
                             f"its .json says {record.label}; the shard is damaged")
        return record


class _Shard:
    """The open shard of one split: its file, its index lines so far, its byte and sample counts."""

    def __init__(self, folder: Path, split: str, number: int, offset: int = 0, lines: list[str] | None = None):
        self.name = shard_name(split, number)
        self.number = number
        self.path = folder / self.name
        self.file = open(self.path, "r+b" if offset else "wb")
        self.file.truncate(offset)
        self.file.seek(offset)
        self.lines = list(lines or [])
        self.offset = offset

    def add(self, key: str, members: list[tuple[str, bytes]]) -> None:
        """Append one sample's members in one write; note each member's data offset for the index."""
        fields, parts = [], []
        for ext, payload in members:
            name = f"{key}.{ext}"
            parts += (member_header(name, len(payload)), payload, b"\0" * (-len(payload) % BLOCK))
            fields.append(f"{ext} {self.offset + BLOCK} {len(payload)} {name}")
            self.offset += BLOCK + len(payload) + (-len(payload) % BLOCK)
        self.file.write(b"".join(parts))
        self.lines.append(" ".join(fields))

    def finish(self) -> dict[str, Any]:
        self.file.write(b"\0" * (2 * BLOCK))
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()
        idx = self.path.with_name(idx_name(self.name))
        idx.write_text(f"{IDX_VERSION} {len(self.lines)}\n" + "".join(f"{l}\n" for l in self.lines), encoding="ascii")
        return {"name": self.name, "samples": len(self.lines), "bytes": self.path.stat().st_size}


class WdsWriter(Writer):
    """Appends samples to the current shard of each split and rolls to a new one past `shard_bytes`."""

    def __init__(self, staging: Path, *, size_hint: int, shard_bytes: int) -> None:
        super().__init__(staging, size_hint=size_hint, shard_bytes=shard_bytes)
        self.shard_bytes = shard_bytes
        self._open: dict[str, _Shard] = {}
        self.shards: dict[str, list[dict[str, Any]]] = {}

    def write(self, split: str, index: int, record: Record) -> None:
        ext = "png" if record.data.startswith(b"\x89PNG") else "jpg"
        members = [("cls", str(record.label).encode()), (ext, record.data),
                   ("i64", np.array([index, record.label], dtype="<i8").tobytes()), ("json", record_meta(record))]
        shard = self._open.get(split)
        if shard is not None and shard.lines and shard.offset + len(record.data) > self.shard_bytes:
            self.shards.setdefault(split, []).append(shard.finish())
            shard = None
        if shard is None:
            shard = self._open[split] = _Shard(self.staging, split, len(self.shards.get(split, [])))
        shard.add(record.key, members)

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
            self._open[split] = _Shard(self.staging, split, o["number"], o["offset"], o["lines"])
        live = {s["name"] for shards in self.shards.values() for s in shards} | {o.name for o in self._open.values()}
        for stray in self.staging.glob("*.tar"):  # shards begun after the checkpoint
            if stray.name not in live:
                stray.unlink()
                stray.with_name(idx_name(stray.name)).unlink(missing_ok=True)

    def close(self, manifest: Manifest) -> None:
        for split, shard in self._open.items():
            self.shards.setdefault(split, []).append(shard.finish())
        self._open = {}
        for split, info in manifest.splits.items():
            info.shards = self.shards.get(split, [])
        write_dir_manifest(self.staging, manifest)

    def abort(self) -> None:
        for shard in self._open.values():
            shard.file.close()


read_manifest = read_dir_manifest
