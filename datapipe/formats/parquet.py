"""Parquet files in the Hugging Face Hub's layout: what their columns, splits and classes are, and
their rows read in place (`open_dataset("data/*.parquet", "val")`, `make_loader(...)`).

A Hub image dataset is Parquet files named by split (`train-00000-of-00257.parquet`, `validation-…`
read as our `val` like a folder's, `test-…`; or files under `train/`, `validation/` folders), each
holding an image column (a struct `{bytes, path}`: the encoded file) and an integer label column.
The `huggingface` entry of the Arrow schema's metadata names the features: the `Image` column and
the `ClassLabel` column with its class names, kept in the Hub's order so labels stay the Hub's ids.
Without it the columns named `image`/`img` and `label`/`labels` are taken, and the classes are "0" ..
the largest label. A label of -1 (the Hub's test splits) is kept: a split without labels.

Beside image and label: a caption column (`caption` or `text`, strings) is each record's
`Fields.text`, and a column of class-id lists (the Hub's `Sequence(ClassLabel)`, or `labels` holding
lists of integers) its multi-labels (`Fields.labels`; the record's label is then its first, -1 when
it has none; the class names are the sequence's). With either, a label column is not needed. Other
columns are not read.

Read in place, a record is a row: the reader keeps the last row group it read, per process, so
reading in row-group order is fast and random access across row groups reads one row group a
record. Give `sampling="shards"` (each row group is a shard) or convert the files first
(`datapipe convert data/ out.wds`, converters.parquet), which also validates every image.
"""
from __future__ import annotations

import bisect
import glob
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from ..records import FIELD_NAMES, Fields, Record, SplitNotFound, multi_labels
from ..scan import make_key
from .base import Dataset, PerProcess

log = logging.getLogger(__name__)
NAME = "parquet"
IMAGE_COLUMNS, LABEL_COLUMNS, CAPTION_COLUMNS = ("image", "img"), ("label", "labels"), ("caption", "text")
_SEQUENCES = ("Sequence", "List", "LargeList")  # the Hub's list features, across `datasets` versions
_SPLIT = re.compile(r"^(train|training|validation|valid|val|test|testing)(?=[-_.]|$)", re.IGNORECASE)
_SPLIT_NAMES = {"training": "train", "validation": "val", "valid": "val", "testing": "test"}
UNLABELED = -1  # the Hub's label of a row without one (test splits)


def pyarrow() -> tuple[Any, Any]:
    """pyarrow and pyarrow.parquet, imported when a Parquet file is met (nothing else needs them)."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise ImportError("reading Parquet files needs pyarrow: pip install 'datapipe[parquet]'") from None
    return pa, pq


def split_of(path: Path) -> str:
    """The split a Hub file belongs to, from its name (`validation-00000-of-00001.parquet`) or its
    folder's (`validation/0000.parquet`); `train` when neither says."""
    for name in (path.name, path.parent.name):
        found = _SPLIT.match(name)
        if found:
            split = found.group(1).lower()
            return _SPLIT_NAMES.get(split, split)
    return "train"


@dataclass(frozen=True)
class HubFile:
    """What a Parquet file holds: its image and label columns, class names, labels and row groups."""

    path: Path
    image: str
    label: str | None  # None: the labels are the multi-label column's first ids, or -1
    classes: list[str] | None  # the ClassLabel names in the schema's metadata
    labels: list[int]
    groups: list[tuple[int, int]]  # (rows, compressed bytes of the image column) per row group
    caption: str | None = None  # the caption column (Fields.text)
    multi: str | None = None  # the multi-label column: a list of class ids a row (Fields.labels)
    top: int = UNLABELED  # the largest class id of a row (of the multi-label lists: not only their first)

    @property
    def fields(self) -> tuple[str, ...]:
        """The record fields (FIELD_NAMES) its rows carry."""
        return tuple(name for name, col in (("text", self.caption), ("labels", self.multi)) if col)


def _features(schema: Any) -> dict[str, Any]:
    """The Hugging Face features stored in the Arrow schema's metadata ({} when there are none)."""
    raw = (schema.metadata or {}).get(b"huggingface")
    try:
        features = json.loads(raw)["info"]["features"] if raw else {}
    except (ValueError, KeyError, TypeError):
        return {}
    return features if isinstance(features, dict) else {}


def _column(path: Path, names: list[str], features: dict[str, Any], kind: str, fallback: tuple[str, ...]) -> str:
    """The column holding `kind` (a feature `_type`: Image, ClassLabel), else the first of `fallback`;
    a ValueError naming the file, the column and the columns found otherwise."""
    typed = [n for n in names if isinstance(features.get(n), dict) and features[n].get("_type") == kind]
    found = typed or [n for n in fallback if n in names]
    if not found:
        raise ValueError(f"{path}: no {fallback[0]!r} column ({kind}; looked for {', '.join(fallback)}); its columns "
                         f"are {', '.join(names) or 'none'}. Convert Parquet files with an image and a label "
                         "(or caption) column")
    return found[0]


def _caption_column(path: Path, schema: Any) -> str | None:
    """The caption column (the first of CAPTION_COLUMNS), None without one; a ValueError naming it
    when it does not hold strings."""
    pa, _ = pyarrow()
    name = next((n for n in CAPTION_COLUMNS if n in schema.names), None)
    if name is not None and not (pa.types.is_string(schema.field(name).type)
                                 or pa.types.is_large_string(schema.field(name).type)):
        raise ValueError(f"{path}: the caption column {name!r} holds {schema.field(name).type}, not strings; "
                         f"rename it (captions are read from {' or '.join(CAPTION_COLUMNS)}) or store text")
    return name


def _sequence_names(feature: Any) -> list[str] | None:
    """The class names of a `Sequence(ClassLabel)` feature; None for any other feature."""
    if isinstance(feature, list) and len(feature) == 1:  # the old way a list feature was written
        inner = feature[0]
    elif isinstance(feature, dict) and feature.get("_type") in _SEQUENCES:
        inner = feature.get("feature")
    else:
        return None
    names = inner.get("names") if isinstance(inner, dict) and inner.get("_type") == "ClassLabel" else None
    return [str(n) for n in names] if isinstance(names, list) else None


def _multi_column(schema: Any, features: dict[str, Any]) -> tuple[str | None, list[str] | None]:
    """The multi-label column (lists of integers: a Sequence(ClassLabel) feature, or named `labels`)
    and its class names when the feature has them."""
    pa, _ = pyarrow()
    for name in schema.names:
        kind = schema.field(name).type
        if (pa.types.is_list(kind) or pa.types.is_large_list(kind)) and pa.types.is_integer(kind.value_type):
            names = _sequence_names(features.get(name))
            if names is not None or name == "labels":
                return name, names
    return None, None


def _has_label(schema: Any, features: dict[str, Any]) -> bool:
    return any(n in LABEL_COLUMNS or isinstance(features.get(n), dict) and features[n].get("_type") == "ClassLabel"
               for n in schema.names)


def read_hub_file(path: Path) -> HubFile:
    """The footer and label column of one Parquet file; a ValueError (one line) for a file that is
    not readable Parquet (a truncated download), that lacks the image column, or the label column
    when it has no caption or multi-label column, or whose caption column holds no text."""
    pa, pq = pyarrow()
    try:
        pf = pq.ParquetFile(path)
        schema, meta = pf.schema_arrow, pf.metadata
        features = _features(schema)
        image = _column(path, schema.names, features, "Image", IMAGE_COLUMNS)
        caption, (multi, multi_names) = _caption_column(path, schema), _multi_column(schema, features)
        label, top = None, UNLABELED
        if multi is None and (caption is None or _has_label(schema, features)):
            label = _column(path, schema.names, features, "ClassLabel", LABEL_COLUMNS)
            if not pa.types.is_integer(schema.field(label).type):
                raise ValueError(f"{path}: the label column {label!r} holds {schema.field(label).type}, not "
                                 "integers; convert Parquet files whose labels are class ids")
        if label is not None:
            labels = [UNLABELED if v is None else v for v in pf.read(columns=[label]).column(0).to_pylist()]
            top = max(labels, default=UNLABELED)
        elif multi is not None:
            lists = [[v for v in ids or () if v is not None] for ids in pf.read(columns=[multi]).column(0).to_pylist()]
            labels = [min(ids, default=UNLABELED) for ids in lists]
            top = max((max(ids) for ids in lists if ids), default=UNLABELED)
        else:
            labels = [UNLABELED] * meta.num_rows
    except (pa.ArrowException, OSError) as exc:
        raise ValueError(f"{path}: not readable as Parquet ({str(exc).splitlines()[0]}); a truncated download? "
                         f"Fetch it again, or move it out of the folder") from None
    groups = []
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        leaves = (group.column(c) for c in range(group.num_columns))
        groups.append((group.num_rows, sum(c.total_compressed_size for c in leaves
                                           if c.path_in_schema.split(".")[0] == image)))
    names = features.get(label, {}).get("names") if isinstance(features.get(label), dict) else None
    classes = multi_names if multi else [str(n) for n in names] if isinstance(names, list) else None
    return HubFile(path, image, label, classes, labels, groups, caption, multi, top)


def row_fields(source: str | Path | BinaryIO, info: HubFile, group: int | None = None) -> tuple[list, list]:
    """The captions and multi-label id lists of row group `group` (None: of the whole file), each a
    list of one value a row (None where the row, or the file, has none); pyarrow's error when they
    cannot be read."""
    _, pq = pyarrow()
    pf = pq.ParquetFile(source)
    columns = [c for c in (info.caption, info.multi) if c]
    table = pf.read(columns=columns) if group is None else pf.read_row_group(group, columns=columns)
    rows = [None] * table.num_rows
    return tuple(table.column(c).to_pylist() if c else rows for c in (info.caption, info.multi))  # type: ignore


def record_fields(text: str | None, ids: list | None, info: HubFile, classes: int | None = None) -> Fields:
    """A row's Fields from its caption and multi-label ids (sorted, unique; a ValueError naming one
    outside `classes`)."""
    labels = multi_labels([v for v in ids or () if v is not None], classes) if info.multi else None
    return Fields(text, None, labels)


def class_names(files: list[HubFile]) -> list[str]:
    """The ClassLabel names in the metadata (a train file's first), else "0" .. the largest class id."""
    named = next((f.classes for f in sorted(files, key=lambda f: split_of(f.path) != "train") if f.classes), None)
    if named is not None:
        return named
    top = max((f.top for f in files), default=-1)
    log.info("no class names in the Parquet metadata: the classes are the labels 0..%d as text", top)
    return [str(n) for n in range(top + 1)]


def row_group_images(source: str | BinaryIO, group: int, column: str) -> list[bytes | None]:
    """The image bytes of each row of row group `group` (None: a null image, or a path only); pyarrow's
    error when the row group cannot be read."""
    pa, pq = pyarrow()
    values = pq.ParquetFile(source).read_row_group(group, columns=[column]).column(0)
    if pa.types.is_struct(values.type):
        values = pa.chunked_array([chunk.field("bytes") for chunk in values.chunks], values.type.field("bytes").type)
    return values.to_pylist()  # type: ignore[no-any-return]


def is_parquet_pattern(path: object) -> bool:
    """A path or glob pattern of Parquet files (`data/*.parquet`, `data/train-00000-of-00001.parquet`)."""
    return isinstance(path, (str, Path)) and str(path).lower().endswith(".parquet")


class ParquetDataset(Dataset):
    """One split of the Parquet files matching `pattern`, read in place row by row; each row group is
    a shard (`shard_sizes`). Not validated: a bad image fails when it is decoded."""

    format = NAME
    validated = False

    def __init__(self, pattern: str | Path, split: str = "train") -> None:
        pattern = str(pattern)
        paths = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
        if not paths or not Path(paths[0]).is_file():
            raise FileNotFoundError(f"no Parquet file matches {pattern}")
        files = [read_hub_file(Path(p)) for p in paths]  # every split's: the classes are train's
        mine = [f for f in files if split_of(f.path) == split]
        if not mine:
            found = ", ".join(sorted({split_of(f.path) for f in files}))
            raise SplitNotFound(f"split {split!r} not in {pattern}: its files hold {found} (split from the file names)")
        self.files = [(str(f.path), f.image) for f in mine]
        self._infos = mine
        self.fields = tuple(n for n in FIELD_NAMES if any(n in f.fields for f in mine))
        self._groups = [(n, g) for n, f in enumerate(mine) for g in range(len(f.groups))]
        rows = [rows for f in mine for rows, _ in f.groups]
        self._starts = np.concatenate([[0], np.cumsum(rows)]).astype(np.int64)
        self._file_starts = np.concatenate([[0], np.cumsum([len(f.labels) for f in mine])]).astype(np.int64)
        self.labels = np.array([v for f in mine for v in f.labels], dtype=np.int64)
        super().__init__(Path(paths[0]).parent, split=split, classes=class_names(files), size=len(self.labels))
        self._last = PerProcess(dict)  # this process's last row group: {"at": (file, group), "rows": [...]}

    def shard_sizes(self) -> np.ndarray:
        return np.diff(self._starts)

    def _read(self, index: int) -> Record:
        at = bisect.bisect_right(self._starts, index) - 1
        number, group = self._groups[at]
        path, column = self.files[number]
        last = self._last.get()
        info = self._infos[number]
        if last.get("at") != (number, group):
            last.clear()  # one row group in memory
            last.update(at=(number, group), rows=row_group_images(path, group, column),
                        fields=row_fields(path, info, group) if info.fields else None)
        row, at_row = index - int(self._file_starts[number]), index - int(self._starts[at])
        data = last["rows"][at_row]
        fields = record_fields(last["fields"][0][at_row], last["fields"][1][at_row], info) if info.fields else Fields()
        key = make_key(f"{Path(path).stem}/{row:08d}", set())
        return Record(key, data or b"", int(self.labels[index]), f"{path}#row {row}", "", fields)
