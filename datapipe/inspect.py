"""`info` and `verify`: describe a packed dataset from its manifest; re-read and check every record;
check the file an LMDB or HDF5 dataset's C library parses against a sha256 you trust, before it does."""
from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from .formats import hdf5, lmdb, open_dataset, read_manifest
from .records import CHAIN_START, chain_digest, record_digest
from .scan import scan_folder
from .storage import is_url, redact

log = logging.getLogger(__name__)

def describe(path: str | Path) -> dict[str, Any]:
    """The manifest as a plain dict (format, classes, splits with samples/bytes/skipped, arguments)."""
    path = path if is_url(path) else Path(path)
    manifest = read_manifest(path)
    if manifest is None:
        open_dataset(path)  # raises the right error for an interrupted or foreign path
        layout = scan_folder(path)
        return {"format": "folder", "path": str(path), "classes": list(layout.classes.classes),
                "splits": {s: {"samples": len(f), "skipped": layout.skipped.get(s, [])}
                           for s, f in layout.splits.items()}}
    body = {"path": redact(path), "format": manifest.format, "version": manifest.version,
            "classes": manifest.classes, "created": manifest.created, "seconds": manifest.seconds,
            "arguments": manifest.arguments, "errors": manifest.errors, "splits": {}}
    for name, info in manifest.splits.items():
        body["splits"][name] = {"samples": info.samples, "bytes": info.bytes, "digest": info.digest,
                                "skipped": info.skipped, "shards": len(info.shards)}
    return body


@dataclass
class VerifyReport:
    """Records checked and the problems found, first one first."""

    records: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def parsed_file(path: str | Path) -> Path:
    """The file a C library parses when `path` is opened: an HDF5 file itself, an LMDB folder's data.mdb."""
    path = Path(path)
    if hdf5.is_hdf5(path):
        return path
    if (path / lmdb.DATA_FILE).is_file():
        return path / lmdb.DATA_FILE
    raise ValueError(f"{path} is neither an HDF5 file nor an LMDB folder: a sha256 checks the file their C libraries "
                     "parse; other datasets are read by datapipe's own code (check them with `datapipe verify`)")


def check_sha256(path: str | Path, expected: str, *, progress: bool = False) -> None:
    """A ValueError unless the file an LMDB or HDF5 dataset's C library parses has the sha256 you trust
    (what `sha256sum` prints); read in Python, before anything parses it: those parsers do not defend
    against crafted files."""
    want = expected.strip().lower()
    if not re.fullmatch(r"[0-9a-f]{64}", want):
        raise ValueError(f"sha256 {expected[:80]!r} is not 64 hex digits (what `sha256sum FILE` prints)")
    file = parsed_file(path)
    digest = hashlib.sha256()
    log.info("datapipe: checking the sha256 of %s before opening it", file)
    with open(file, "rb") as fh, tqdm(total=file.stat().st_size, unit="B", unit_scale=True,
                                       desc=f"sha256 {file.name}", disable=not progress) as bar:
        for chunk in iter(lambda: fh.read(8 << 20), b""):
            digest.update(chunk)
            bar.update(len(chunk))
    if digest.hexdigest() != want:
        raise ValueError(f"{file}: its sha256 is {digest.hexdigest()}, not the {want} you trust: it is another file "
                         "(changed, damaged or crafted); not opened")


def verify(path: str | Path, *, progress: bool = True, sha256: str | None = None) -> VerifyReport:
    """Re-read every record of every split; check each against its digest and each split against the
    manifest's count and chained digest. With `sha256`, an LMDB or HDF5 file must first match it
    (`check_sha256`): nothing parses a file that does not."""
    if sha256 is not None:
        check_sha256(path, sha256, progress=progress)
    path = path if is_url(path) else Path(path)
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
            digest = record_digest(rec.key, rec.label, rec.data)
            if digest != rec.sha256:
                report.problems.append(f"split {split!r} record {i} (key {rec.key}, from {rec.path}): "
                                       "checksum mismatch, its stored bytes, label or key changed")
            chain = chain_digest(chain, digest)
        if chain != info.digest:
            report.problems.append(f"split {split!r}: digest over all records differs from the manifest "
                                   "(records changed, reordered, added or lost)")
    return report
