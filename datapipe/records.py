"""The on-disk contract shared by readers and writers: Sample, Record, ClassIndex, Manifest.

Every packed dataset describes itself with a Manifest (JSON, never pickle). Each record carries a
sha256 over its key, label and bytes; the manifest holds, per split, a digest chained over those
record digests in order, so `verify` can name the first damaged record and also catch reordering,
loss or additions.
"""
from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, NamedTuple

from .errors import quoted, summary
from .names import UnsafeName, check_digest, check_name

MANIFEST_NAME = "manifest.json"
MANIFEST_VERSION = 2  # 2: a .wds record's .i64 holds its write position (skipped files keep theirs)
TABLE_VERSION = 3  # 3: a .wds split's shards in its shard table (`table`), not listed (formats.shard_table)
READABLE_VERSIONS = (1, 2, 3)
CHAIN_START = "0" * 64


# Sources without class names (a .cls member, a Parquet label column without ClassLabel names) get
# the classes "0" .. the largest id. A hostile or broken id (10^9) would build that list in full
# (23 GB): ids are bounded by this documented cap (ImageNet-21k has 21,841 classes; the largest
# face-identity sets ~10^6), and an id past it is a bad record, not a class list.
MAX_INFERRED_CLASSES = 1_000_000


def inferred_class_names(top: int) -> list[str]:
    """The class names "0" .. `top` of a source whose labels are bare ids (top -1: no class).
    Callers keep ids over MAX_INFERRED_CLASSES - 1 out (a bad record), so this list stays bounded."""
    if top >= MAX_INFERRED_CLASSES:
        raise ValueError(f"label id {top} is past the cap of {MAX_INFERRED_CLASSES:,} classes for sources "
                         "without class names (datapipe.records.MAX_INFERRED_CLASSES)")
    return [str(n) for n in range(top + 1)]


class SplitNotFound(ValueError):
    """The dataset has no split of that name (the message lists the ones it has)."""


class Sample(NamedTuple):
    """One record as the loaders see it: a stable key, the encoded image bytes, the class index."""

    key: str
    data: bytes
    label: int


class Fields(NamedTuple):
    """What a record carries beside its image and class: a caption (`text`), JSON metadata (`meta`, a
    JSON object's text, canonical: `canonical_meta`) and multi-label targets (`labels`, class ids,
    sorted, unique). None: the record has no such field."""

    text: str | None = None
    meta: str | None = None
    labels: tuple[int, ...] | None = None

    def __bool__(self) -> bool:
        return any(v is not None for v in self)

    def to_json(self) -> dict[str, Any]:
        """The fields a record has, as a JSON object (those it lacks left out)."""
        return {name: list(v) if name == "labels" else v for name, v in zip(self._fields, self) if v is not None}

    @classmethod
    def from_json(cls, body: dict[str, Any] | None) -> "Fields":
        if not body:
            return NO_FIELDS
        labels = body.get("labels")
        return cls(body.get("text"), body.get("meta"), None if labels is None else tuple(int(x) for x in labels))


NO_FIELDS = Fields()
FIELD_NAMES = Fields._fields  # what a dataset may carry beside image and label, in this order


def canonical_meta(meta: Any) -> str:
    """A record's JSON metadata as stored: an object, keys sorted, compact, ASCII (other characters
    as JSON escapes, so any valid JSON, a lone surrogate's escape too, encodes; json.loads gives the
    same object back)."""
    if isinstance(meta, (str, bytes)):
        meta = json.loads(meta)
    if not isinstance(meta, dict):
        raise ValueError(f"metadata must be a JSON object, got a JSON {type(meta).__name__}")
    return json.dumps(meta, sort_keys=True, separators=(",", ":"))


def multi_labels(labels: Any, classes: int | None = None) -> tuple[int, ...]:
    """Multi-label targets as stored: class ids sorted and unique; a ValueError names one out of range."""
    ids = tuple(sorted({int(x) for x in labels}))
    bad = [i for i in ids if i < 0 or (classes is not None and i >= classes)]
    if bad:
        raise ValueError(f"label {bad[0]} is not a class id (0..{(classes or 0) - 1})")
    return ids


class Record(NamedTuple):
    """A sample plus the metadata stored beside it (original relative path, record digest) and the
    record's other fields (caption, JSON metadata, multi-label targets), if any."""

    key: str
    data: bytes
    label: int
    path: str
    sha256: str
    fields: Fields = NO_FIELDS

    @property
    def sample(self) -> Sample:
        return Sample(self.key, self.data, self.label)


def record_digest(key: str, label: int, data: bytes, fields: Fields = NO_FIELDS) -> str:
    """sha256 over key, label, the other fields and the bytes: a change to any of them changes the
    digest. A record without other fields has the digest it had before fields existed."""
    extra = f"\1{json.dumps(fields.to_json(), sort_keys=True)}" if fields else ""
    h = hashlib.sha256(f"{key}\0{label}{extra}\0".encode())
    h.update(data)
    return h.hexdigest()


def chain_digest(previous: str, digest: str) -> str:
    """Extend a split's running digest by one record digest (order-sensitive, resumable)."""
    return hashlib.sha256(f"{previous}{digest}".encode()).hexdigest()


class ClassIndex:
    """Class names in label order (sorted, like torchvision's ImageFolder) and their indices."""

    def __init__(self, classes: list[str] | tuple[str, ...]) -> None:
        self.classes = tuple(classes)
        self._index = {name: i for i, name in enumerate(self.classes)}
        if len(self._index) != len(self.classes):
            repeated = [name for name, count in Counter(self.classes).items() if count > 1]
            raise ValueError(f"class names must be unique; {summary(repeated, 'duplicate class name')}")

    def __len__(self) -> int:
        return len(self.classes)

    def __contains__(self, name: str) -> bool:
        return name in self._index

    def label(self, name: str) -> int:
        try:
            return self._index[name]
        except KeyError:
            raise ValueError(f"unknown class {quoted(name)}; the class list (from the train split) has "
                             f"{summary(self.classes, 'class', 'classes', show=10)}") from None


@dataclass
class SplitInfo:
    """What one split holds: counts, bytes, the chained digest, the skipped inputs, the shards (listed
    up to manifest version 2; from version 3 in the shard table `table` describes)."""

    samples: int = 0
    bytes: int = 0
    digest: str = CHAIN_START
    skipped: list[dict[str, str]] = field(default_factory=list)
    shards: list[dict[str, Any]] = field(default_factory=list)
    index: dict[str, Any] = field(default_factory=dict)  # a sharded format's index file: name, bytes, sha256
    fields: list[str] = field(default_factory=list)  # FIELD_NAMES some record of the split carries
    table: dict[str, Any] = field(default_factory=dict)  # the shard table: name, bytes, sha256, head_sha256,
    # shards, shard_bytes (their total), largest_shard (datapipe.formats.shard_table)

    @property
    def shard_count(self) -> int:
        return int(self.table["shards"]) if self.table else len(self.shards)

    def add(self, record: Record) -> None:
        """Count one stored record and extend the chain."""
        self.samples += 1
        self.bytes += len(record.data)
        self.digest = chain_digest(self.digest, record.sha256)
        if record.fields:
            self.note_fields(record.fields)

    def note_fields(self, fields: Fields) -> None:
        """Add the names of the fields `fields` has to the split's list (in FIELD_NAMES order)."""
        self.fields = field_union(self.fields, [name for name, v in zip(FIELD_NAMES, fields) if v is not None])


def field_union(*names: Iterable[str]) -> list[str]:
    """The field names in any of the lists, in FIELD_NAMES order (SplitInfo.fields: a split's, merged
    from its shards' or its images')."""
    have = {name for some in names for name in some}
    return [name for name in FIELD_NAMES if name in have]


@dataclass
class Manifest:
    """The self-description every output carries; readers dispatch on it and never guess."""

    format: str
    classes: list[str]
    splits: dict[str, SplitInfo]
    arguments: dict[str, Any] = field(default_factory=dict)
    version: int = MANIFEST_VERSION
    created: str = ""
    seconds: float = 0.0

    @property
    def errors(self) -> int:
        return sum(len(s.skipped) for s in self.splits.values())

    def to_json(self) -> str:
        body = asdict(self)
        body["errors"] = self.errors
        for info in body["splits"].values():  # a split without fields (or table) is written as before they
            for key in ("fields", "table"):   # existed, so the datapipe before them still reads it
                if not info[key]:
                    del info[key]
        return json.dumps(body, indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str, *, source: str = "manifest") -> "Manifest":
        try:
            body = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{source} is not valid JSON ({exc}); the dataset is damaged, re-convert it") from None
        if not isinstance(body, dict):
            raise ValueError(f"{source} holds a JSON {type(body).__name__}, not a manifest object; "
                             "the dataset is damaged, re-convert it")
        version = body.get("version")
        if version not in READABLE_VERSIONS:
            raise ValueError(
                f"{source} has manifest version {version!r}; this datapipe reads versions {READABLE_VERSIONS}. "
                "Re-convert the dataset with this version or install the datapipe that wrote it."
            )
        body.pop("errors", None)
        try:
            splits = body["splits"]
            body["splits"] = {str(name): SplitInfo(**info) for name, info in splits.items()}
            manifest = cls(**body)
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"{source} is not a complete manifest ({type(exc).__name__}: {exc}); "
                             "the dataset is damaged, re-convert it") from None
        if not isinstance(manifest.format, str) or not isinstance(manifest.classes, list) or any(
                not isinstance(s.samples, int) or s.samples < 0 for s in manifest.splits.values()):
            raise ValueError(f"{source} has a malformed format, class list or sample count; "
                             "the dataset is damaged, re-convert it")
        check_names(manifest, source)
        return manifest

    def digest(self) -> str:
        """sha256 of the manifest's canonical JSON: one conversion's output. Another conversion to the
        same path differs, if only in its `created` time; a copy of the same output does not."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()

    def content_digest(self, split: str) -> str:
        """sha256 of what a loader's positions point at in `split`: its chained record digest, count,
        shard sizes and the class list; not when or how it was converted (a resume compares it). With a
        shard table, its head's sha256 stands for the shard sizes (it covers them): the same records
        listed in a version 2 manifest have another fingerprint."""
        info = self.split(split)
        shards = {"table": info.table["head_sha256"]} if info.table else [s.get("samples") for s in info.shards]
        body = [split, info.digest, info.samples, shards, self.classes]
        return hashlib.sha256(json.dumps(body).encode()).hexdigest()

    def split(self, name: str) -> SplitInfo:
        """The named split, or a ValueError listing the splits there are."""
        if name not in self.splits:
            raise SplitNotFound(f"split {quoted(name)} not in this dataset; it has "
                                f"{summary(sorted(self.splits), 'split', show=5)}")
        return self.splits[name]


def check_names(manifest: Manifest, source: str) -> None:
    """Every name the manifest gives (splits, shards, index files) is a plain relative name inside the
    dataset, every digest hex and every size a count (datapipe.names): a crafted manifest fails here,
    for a local and a remote dataset alike, before any of its names becomes a path."""
    for split, info in manifest.splits.items():
        where = f"{source}: splits[{split!r}]"
        check_name(split, f"{source}: split name")
        if not isinstance(info.shards, list) or not isinstance(info.index, dict) or not isinstance(info.table, dict):
            raise UnsafeName(f"{where} has malformed shards, index or table; the dataset is damaged or was crafted")
        if info.table:
            check_table(info.table, f"{where}.table")
            if info.shards:
                raise UnsafeName(f"{where} lists shards and a shard table; the dataset is damaged or was crafted")
        entries = [(f"{where}.shards[{n}]", s) for n, s in enumerate(info.shards)]
        for field, entry in entries + ([(f"{where}.index", info.index)] if info.index else []):
            if not isinstance(entry, dict):
                raise UnsafeName(f"{field} is not an object; the dataset is damaged or was crafted")
            check_name(entry.get("name"), f"{field}.name")
            if entry.get("sha256") is not None:
                check_digest(entry["sha256"], f"{field}.sha256")
            for count in ("bytes", "samples") if field.endswith("]") else ("bytes",):
                check_count(entry.get(count), f"{field}.{count}")
        if not isinstance(info.skipped, list) or not all(isinstance(s, dict) for s in info.skipped):
            raise UnsafeName(f"{where}.skipped is not a list of objects; the dataset is damaged or was crafted")
        for n, entry in enumerate(info.skipped):
            if "position" in entry:
                check_count(entry["position"], f"{where}.skipped[{n}].position")


def check_table(table: dict[str, Any], field: str) -> None:
    """A split's shard table entry: a plain name, its digests hex, its sizes and counts counts."""
    check_name(table.get("name"), f"{field}.name")
    for key in ("sha256", "head_sha256"):
        check_digest(table.get(key), f"{field}.{key}")
    for key in ("bytes", "shards", "shard_bytes", "largest_shard"):
        check_count(table.get(key), f"{field}.{key}")


def check_count(value: object, field: str) -> None:
    """A manifest's size or count: a non-negative int below 2**53 (what JSON numbers hold exactly)."""
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2 ** 53:
        raise UnsafeName(f"{field} {str(value)[:40]!r} is not a count; the dataset is damaged or was crafted")
