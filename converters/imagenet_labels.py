"""ImageNet's validation labels: from the devkit (ground truth ids mapped to WordNet ids by meta.mat)
or from Kaggle's `LOC_val_solution.csv`.

The devkit (`ILSVRC2012_devkit_t12.tar.gz`, ~2.5 MB) is read in memory, never extracted; an
extracted `ILSVRC2012_devkit_t12/` folder works too. `data/ILSVRC2012_validation_ground_truth.txt`
holds one ILSVRC2012 id (1..1000) per line, line i for `ILSVRC2012_val_{i:08d}.JPEG`;
`data/meta.mat` (read by converters.matfile) maps each id to its WordNet id.
"""
from __future__ import annotations

import csv
import gzip
import io
import re
import tarfile
import zlib
from dataclasses import dataclass
from pathlib import Path

from .matfile import read_mat

GROUND_TRUTH = "data/ILSVRC2012_validation_ground_truth.txt"
META = "data/meta.mat"
MAX_DEVKIT = 64 << 20  # the devkit inflates to ~10 MB: a bound, not a limit anyone meets
VAL_NAME = re.compile(r"^ILSVRC2012_val_(\d{8})\.[A-Za-z]+$")


@dataclass(frozen=True)
class ValLabels:
    """Validation labels from one source: `wnid(name)` gives a val file's WordNet id (None: no label);
    `classes`, the leaf classes the source knows (sorted), stand in when there is no train split."""

    source: str
    classes: list[str]
    by_number: list[str] | None = None  # devkit: WNID of ILSVRC2012_val_{i+1:08d}
    by_stem: dict[str, str] | None = None  # Kaggle: WNID of each ImageId

    def wnid(self, name: str) -> str | None:
        base = name.rsplit("/", 1)[-1]
        if self.by_stem is not None:
            return self.by_stem.get(base.rsplit(".", 1)[0])
        number = VAL_NAME.match(base)
        if number is None or not 1 <= int(number.group(1)) <= len(self.by_number or ()):
            return None
        return self.by_number[int(number.group(1)) - 1]  # type: ignore[index]

    def check_count(self, images: int, where: str) -> None:
        """The devkit labels the whole val set by position: its count must be the images'."""
        if self.by_number is not None and len(self.by_number) != images:
            raise ValueError(f"{self.source} has {len(self.by_number)} labels but {where} holds {images} images; "
                             "they must match (re-download the one that is incomplete)")


def _devkit_files(devkit: Path) -> dict[str, bytes]:
    """GROUND_TRUTH and META of the devkit (a .tar.gz read in memory, or an extracted folder)."""
    wanted = (GROUND_TRUTH, META)
    if devkit.is_dir():
        return {name: (devkit / name).read_bytes() for name in wanted if (devkit / name).is_file()}
    try:
        with gzip.open(devkit, "rb") as fh:
            blob = fh.read(MAX_DEVKIT + 1)
        if len(blob) > MAX_DEVKIT:
            raise ValueError(f"{devkit} inflates to more than {MAX_DEVKIT >> 20} MiB; it is not ImageNet's devkit")
        found = {}
        with tarfile.open(fileobj=io.BytesIO(blob), mode="r:") as tar:  # read in memory, never extracted
            for member in tar:
                name = next((w for w in wanted if member.name == w or member.name.endswith("/" + w)), None)
                if name is not None and member.isfile():
                    found[name] = tar.extractfile(member).read()  # type: ignore[union-attr]
        return found
    except (OSError, EOFError, tarfile.TarError, zlib.error) as exc:
        raise ValueError(f"{devkit} is not a readable .tar.gz ({exc}); re-download it") from None


def devkit_labels(devkit: Path) -> ValLabels:
    """The validation labels the devkit gives, or a ValueError saying what is missing or damaged."""
    files = _devkit_files(devkit)
    missing = [name for name in (GROUND_TRUTH, META) if name not in files]
    if missing:
        raise ValueError(f"{devkit} holds no {' and no '.join(missing)}; the devkit is incomplete (re-download "
                         "ILSVRC2012_devkit_t12.tar.gz)")
    wnids, leaves = _synsets(files[META], f"{devkit.name}:{META}")
    lines = files[GROUND_TRUTH].decode("ascii", "replace").split()
    labels = []
    for number, text in enumerate(lines, 1):
        wnid = wnids.get(int(text)) if text.isdigit() else None
        if wnid is None:
            raise ValueError(f"{devkit.name}:{GROUND_TRUTH} line {number} ({text[:20]!r}) is not an ILSVRC2012 id "
                             f"of {META}; the devkit is damaged (re-download it)")
        labels.append(wnid)
    return ValLabels(f"{devkit.name}:{GROUND_TRUTH}", leaves, by_number=labels)


def _synsets(blob: bytes, where: str) -> tuple[dict[int, str], list[str]]:
    """ILSVRC2012 id -> WNID for every synset of meta.mat, and the leaf classes' WNIDs, sorted."""
    synsets = read_mat(blob, where=where).get("synsets")
    ok = isinstance(synsets, list) and synsets and all(
        isinstance(s, dict) and isinstance(s.get("WNID"), str) and s.get("ILSVRC2012_ID") for s in synsets)
    if not ok:
        raise ValueError(f"{where} has no 'synsets' struct array with ILSVRC2012_ID and WNID fields; "
                         "re-download the devkit")
    wnids = {int(s["ILSVRC2012_ID"][0]): s["WNID"] for s in synsets}
    leaves = [s["WNID"] for s in synsets if not (s.get("num_children") or [0])[0]]
    return wnids, sorted(leaves)


def solution_labels(solution: Path) -> ValLabels:
    """Kaggle's LOC_val_solution.csv: `ImageId,PredictionString`, the string starting with the WNID."""
    with open(solution, newline="", encoding="utf-8") as fh:
        rows = list(csv.reader(fh))
    if not rows or [c.strip() for c in rows[0][:2]] != ["ImageId", "PredictionString"]:
        raise ValueError(f"{solution} does not start with the header 'ImageId,PredictionString'; it is not "
                         "Kaggle's LOC_val_solution.csv")
    by_stem = {}
    for number, row in enumerate(rows[1:], 2):
        if not row:
            continue
        words = row[1].split() if len(row) >= 2 else []
        if not words:
            raise ValueError(f"{solution} line {number} ({','.join(row)[:60]!r}) is not 'ImageId,WNID ...'")
        by_stem[row[0].strip()] = words[0]
    return ValLabels(solution.name, sorted(set(by_stem.values())), by_stem=by_stem)
