"""`info` and `verify`: describe a packed dataset from its manifest; re-read and check every record."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from ..errors import counted, human_size, plain
from ..records import CHAIN_START, SplitInfo, chain_digest, record_digest
from ..storage import is_url, redact
from . import open_dataset, read_manifest
from .base import Dataset
from .scan import scan_folder
from .trusted import check_sha256


def describe(path: str | Path) -> dict[str, Any]:
    """The manifest as a plain dict (format, classes, splits with samples/bytes/skipped, arguments)."""
    if isinstance(path, str) and not is_url(path) and (path.endswith(".tar") or not Path(path).exists()):
        return _described(open_dataset(path))  # other tools' shards: one, or a pattern (or a Parquet pattern)
    path = path if is_url(path) else Path(path)
    manifest = read_manifest(path)
    if manifest is None:
        opened = open_dataset(path)  # raises the right error for an interrupted or foreign path
        if opened.format != "folder":  # a folder of other tools' shards (img2dataset's)
            return _described(opened)
        layout = scan_folder(path)
        return {"format": "folder", "path": str(path), "classes": list(layout.classes.classes),
                "splits": {s: {"samples": len(f), "skipped": layout.skipped.get(s, []), "fields": _carried(f)}
                           for s, f in layout.splits.items()}}
    body = {"path": redact(path), "format": manifest.format, "version": manifest.version,
            "classes": manifest.classes, "created": manifest.created, "seconds": manifest.seconds,
            "arguments": manifest.arguments, "errors": manifest.errors, "splits": {}}
    for name, info in manifest.splits.items():
        body["splits"][name] = {"samples": info.samples, "bytes": info.bytes, "digest": info.digest,
                                "skipped": info.skipped, "shards": info.shard_count, "fields": list(info.fields)}
    return body


def _described(ds: Dataset) -> dict[str, Any]:
    """What an opened dataset without a manifest says of itself: shards of other tools, Parquet files."""
    return {"format": ds.format, "path": redact(str(ds.path)), "classes": list(ds.classes),
            "splits": {ds.split: {"samples": len(ds), "skipped": [], "fields": list(ds.fields)}}}


def _carried(files: list[Any]) -> list[str]:
    """The FIELD_NAMES some of a folder split's scanned images carry (their sidecars)."""
    info = SplitInfo()
    for f in files:
        if f.fields:
            info.note_fields(f.fields)
    return info.fields


CLASS_LINE = 100  # characters of class names `info`'s text shows; --json lists them all


def class_names(classes: list[str], width: int = CLASS_LINE) -> str:
    """'cat, dog, fish', or the first names that fit in about `width` characters and how many more
    ('n01440764, n01443537, ... and 990 more (--json lists them all)'); each name printable, capped."""
    shown: list[str] = []
    used = 0
    for name in classes:
        text = plain(name, 40) if name and name.strip() == name and "," not in name else repr(name)[:40]
        if shown and used + len(text) > width:
            break
        shown.append(text)
        used += len(text) + 2
    rest = len(classes) - len(shown)
    return ", ".join(shown) + (f", ... and {rest} more (--json lists them all)" if rest else "")


def info_lines(body: dict[str, Any]) -> list[str]:
    """`datapipe info`'s text from `describe`'s dict: format and classes (their names, the first ones of
    many), then each split's counts, size, shards and the fields its records carry besides image and
    label (when they carry some)."""
    classes = body["classes"]
    lines = [f"{plain(body['path'])}: {body['format']}, {counted(len(classes), 'class', 'classes')}"
             + (f": {class_names(classes)}" if classes else "")]
    for name, s in body["splits"].items():
        extra = f", {human_size(s['bytes'])}" if "bytes" in s else ""
        extra += f", {counted(s['shards'], 'shard')}" if s.get("shards") else ""
        carried = f", fields: {', '.join(s['fields'])}" if s.get("fields") else ""
        lines.append(f"  {plain(name)}: {counted(s['samples'], 'sample')}{extra}, {len(s['skipped'])} skipped{carried}")
    return lines


@dataclass
class VerifyReport:
    """Records checked and the problems found, first one first."""

    records: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def verify(path: str | Path, *, progress: bool = True, sha256: str | None = None) -> VerifyReport:
    """Re-read every record of every split; check each against its digest and each split against the
    manifest's count and chained digest. With `sha256`, an LMDB or HDF5 file must first match it
    (`check_sha256`): nothing parses a file that does not."""
    if sha256 is not None:
        check_sha256(path, sha256, progress=progress)
    path = path if is_url(path) else Path(path)
    if isinstance(path, Path) and not path.exists():
        raise ValueError(f"{path} does not exist")
    manifest = read_manifest(path)
    if manifest is None:
        raise ValueError(f"{path} has no manifest to verify against; only packed datasets can be verified")
    report = VerifyReport()
    for split, info in manifest.splits.items():
        ds = open_dataset(path, split)
        chain = CHAIN_START
        for i in tqdm(range(len(ds)), desc=f"verify {split}", unit="rec", disable=not progress):
            report.records += 1
            try:
                rec = ds.record(i)
            except Exception as exc:  # a damaged store raises from its library: report, go on
                report.problems.append(redact(f"split {split!r} record {i}: unreadable ({type(exc).__name__}: {exc})"))
                continue
            digest = record_digest(rec.key, rec.label, rec.data, rec.fields)
            if digest != rec.sha256:
                report.problems.append(f"split {split!r} record {i} (key {rec.key}, from {rec.path}): "
                                       "checksum mismatch, its stored bytes, label or key changed")
            chain = chain_digest(chain, digest)
        if chain != info.digest:
            report.problems.append(f"split {split!r}: digest over all records differs from the manifest "
                                   "(records changed, reordered, added or lost)")
        verify_files = getattr(getattr(ds, "shards", None), "verify_files", None)  # a .wds split's table and shards
        if verify_files is not None:  # after the records: a damaged record is named first, by its key
            try:
                verify_files(progress=progress)
            except ValueError as exc:
                report.problems.append(redact(f"split {split!r}: {exc}"))
    return report
