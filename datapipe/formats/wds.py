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

from ..decode import image_ext
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


Components = dict[str, tuple[str, int, int, str]]  # ext -> (ext, data offset, size, member name)


class ShardIndex:
    """Where every sample of a set of shards lies: its shard and the byte span of its members."""

    def __init__(self, shards: list[str], per_shard: list[list[list[tuple[str, int, int, str]]]]) -> None:
        self.shards = shards
        spans, self.members = [], []
        for number, samples in enumerate(per_shard):
            for components in samples:
                spans.append((number, min(c[1] for c in components) - BLOCK, max(c[1] + c[2] for c in components)))
                self.members.append({c[0]: c for c in components})
        self.spans = np.array(spans, dtype=np.int64).reshape(-1, 3)

    @classmethod
    def from_shards(cls, shards: list[str], *, scan_missing: bool = False) -> "ShardIndex":
        """From the `.idx` beside each shard (or, with scan_missing, a scan of a tar that has none)."""
        per_shard = []
        for shard in shards:
            idx = Path(idx_name(shard))
            if idx.is_file() or not scan_missing:
                per_shard.append(parse_idx(idx.read_text(encoding="ascii")))
            else:
                per_shard.append(scan_tar(shard))
        return cls(shards, per_shard)

    def __len__(self) -> int:
        return len(self.spans)

    def read(self, fds: list[int], index: int) -> dict[str, bytes]:
        """Sample `index`'s members (ext -> bytes) with one pread of its span."""
        number, start, end = (int(v) for v in self.spans[index])
        blob = os.pread(fds[number], end - start, start)
        return {ext: blob[off - start: off - start + size] for ext, (_, off, size, _) in self.members[index].items()}


def _open_fds(shards: list[str]) -> list[int]:
    return [os.open(s, os.O_RDONLY) for s in shards]


class WdsDataset(Dataset):
    """Random access into this project's shards (one pread per sample through the `.idx` files)."""

    format = NAME

    def __init__(self, path: Path, manifest: Manifest, split: str) -> None:
        info = manifest.split(split)
        super().__init__(path, split=split, classes=manifest.classes, size=info.samples)
        self.index = ShardIndex.from_shards([str(Path(path) / s["name"]) for s in info.shards])
        if len(self.index) != info.samples:
            raise ValueError(f"{path}: the .idx files of split {split!r} list {len(self.index)} samples, "
                             f"the manifest {info.samples}; run `datapipe verify` or re-convert")
        self._fds = PerProcess(functools.partial(_open_fds, self.index.shards))

    def _read(self, index: int) -> Record:
        parts = self.index.read(self._fds.get(), index)
        data = next(v for k, v in parts.items() if k not in ("cls", "i64", "json"))
        record = record_from_meta(parts["json"], data)
        shard = self.index.shards[int(self.index.spans[index][0])]
        if parts["cls"] != str(record.label).encode():
            raise ValueError(f"{shard}: {record.key}.cls says {parts['cls']!r}, its .json says {record.label}; "
                             "the shard is damaged")
        stored = np.frombuffer(parts["i64"], dtype="<i8").tolist() if len(parts["i64"]) == 16 else parts["i64"]
        if stored != [index, record.label]:  # DALI's readers.webdataset takes its labels from here
            raise ValueError(f"{shard}: {record.key}.i64 says (index, label) = {stored}, the record is "
                             f"{[index, record.label]}; the shard is damaged")
        return record


def expand_shards(pattern: str) -> list[str]:
    """`shards/train-{000000..000009}.tar` (or a list joined by '::') -> the existing shard paths."""
    import braceexpand

    paths = [p for part in pattern.split("::") for p in braceexpand.braceexpand(part)]
    missing = [p for p in paths if not Path(p).is_file()]
    if missing:
        raise FileNotFoundError(f"{len(missing)} of {len(paths)} shards in {pattern!r} do not exist, e.g. {missing[0]}")
    return paths


def scan_tar(path: str) -> list[list[tuple[str, int, int, str]]]:
    """Index a tar without an .idx: per sample (webdataset grouping: same name up to the first dot of
    the basename, consecutive), its components as (ext, data offset, size, member name)."""
    import tarfile

    samples: list[list[tuple[str, int, int, str]]] = []
    last = None
    with tarfile.open(path, "r:") as tar:
        for member in tar:
            if not member.isfile():
                continue
            folder, _, base = member.name.rpartition("/")
            if "." not in base or base.startswith("."):
                continue
            stem, ext = base.split(".", 1)
            key = f"{folder}/{stem}" if folder else stem
            if key != last:
                samples.append([])
                last = key
            samples[-1].append((ext, member.offset_data, member.size, member.name))
    return samples


class ForeignShardsDataset(Dataset):
    """WebDataset shards written by other tools: a brace pattern, `.cls` labels, any image extension.

    Uses each shard's DALI `.idx` when one lies beside it, else scans the tar once. The class names
    are the label numbers ("0", "1", ...) since such shards carry no class list.
    """

    format = "wds-shards"
    validated = False
    IMAGE_EXTS = ("jpg", "jpeg", "png", "webp", "bmp")

    def __init__(self, pattern: str) -> None:
        shards = expand_shards(pattern)
        self.index = ShardIndex.from_shards(shards, scan_missing=True)
        for number, components in enumerate(self.index.members):
            if "cls" not in components or not self._image_ext(components):
                raise ValueError(f"{pattern}: sample {next(iter(components.values()))[3]!r} lacks a .cls label "
                                 f"or an image ({'/'.join(self.IMAGE_EXTS)}); it has {sorted(components)}")
        super().__init__(Path(shards[0]).parent, split="train", classes=[], size=len(self.index))
        self._fds = PerProcess(functools.partial(_open_fds, shards))
        self._labels = [int(self.index.read(self._fds.get(), i)["cls"]) for i in range(len(self.index))]
        self.classes = [str(c) for c in range(max(self._labels) + 1)]

    def _image_ext(self, components: Components) -> str | None:
        return next((e for e in self.IMAGE_EXTS if e in components), None)

    def _read(self, index: int) -> Record:
        components = self.index.members[index]
        ext = self._image_ext(components)
        name = components[ext][3]
        shard = self.index.shards[int(self.index.spans[index][0])]
        data = self.index.read(self._fds.get(), index)[ext]
        return Record(name.rsplit(".", 1)[0], data, self._labels[index], f"{shard}:{name}", "")


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
        ext = image_ext(record.data) or "jpg"  # stored bytes are JPEG or PNG (datapipe.decode decides)
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
