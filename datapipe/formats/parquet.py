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
lists of integers) its multi-labels (`Fields.labels`). With either, a label column is not needed.
Other columns are not read. Which column gives what, with a list column:
- without an integer label column, the record's label is its smallest id (-1 when it has none), and
  the classes are the sequence's names, else "0" .. the largest id of any list;
- with one (`label`, or a ClassLabel feature) as well, that column stays the record's label and the
  source of the classes (its ClassLabel names; else the sequence's names; else "0" .. the largest
  label); the lists only give `Fields.labels`. A file whose two columns name different classes is a
  ValueError: one list of classes serves both.
Every id is checked against the classes: converted, a row with one outside them is skipped and
listed with its reason; read in place, its record is a one-line ValueError naming the file, the row
and the id (a bad record: the loader's on_error policy serves around it), as is a label outside them.

Read in place, a record is a row: the reader keeps the last row group it read, per process (its
images, labels, captions and ids: nothing a row is held beyond it, so a worker is sent no per-row
array), so reading in row-group order is fast and random access across row groups reads one row
group a record. Give `sampling="shards"` (each row group is a shard) or convert the files first
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
from typing import Any, BinaryIO, NamedTuple

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
    """What a Parquet file holds (its footer): its columns, class names and row groups. Its rows'
    labels are read with the rows (`read_rows`): nothing here grows with the rows."""

    path: Path
    image: str
    label: str | None  # None: the labels are the multi-label column's smallest ids, or -1
    classes: list[str] | None  # the class names in the schema's metadata (the module's rule)
    groups: list[tuple[int, int]]  # (rows, compressed bytes of the image column) per row group
    caption: str | None = None  # the caption column (Fields.text)
    multi: str | None = None  # the multi-label column: a list of class ids a row (Fields.labels)
    top: int = UNLABELED  # without class names: the largest label (or id of a list, without a label column)

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


def _has_label(names: list[str], features: dict[str, Any]) -> bool:
    return any(n in LABEL_COLUMNS or isinstance(features.get(n), dict) and features[n].get("_type") == "ClassLabel"
               for n in names)


def _label_column(path: Path, schema: Any, features: dict[str, Any], multi: str | None,
                  caption: str | None) -> str | None:
    """The integer label column (not the multi-label one): needed without a caption or multi-label
    column, else taken when there is one; a ValueError naming it when it holds no integers."""
    pa, _ = pyarrow()
    names = [n for n in schema.names if n != multi]
    if not (_has_label(names, features) or multi is None and caption is None):
        return None
    label = _column(path, names, features, "ClassLabel", LABEL_COLUMNS)
    if not pa.types.is_integer(schema.field(label).type):
        raise ValueError(f"{path}: the label column {label!r} holds {schema.field(label).type}, not "
                         "integers; convert Parquet files whose labels are class ids")
    return label


def _classes(path: Path, features: dict[str, Any], label: str | None, multi: str | None,
             multi_names: list[str] | None) -> list[str] | None:
    """The class names of the metadata, by the module's rule: the label column's, else the
    multi-label sequence's; a ValueError when both name classes and they differ."""
    named = features.get(label) if label else None
    names = named.get("names") if isinstance(named, dict) else None
    names = [str(n) for n in names] if isinstance(names, list) else None
    if names is not None and multi_names is not None and names != multi_names:
        raise ValueError(f"{path}: the label column {label!r} and the multi-label column {multi!r} name different "
                         f"classes ({', '.join(names[:3])}, ...) and ({', '.join(multi_names[:3])}, ...); one list "
                         "of classes serves both: drop one of the columns, or give them the same ClassLabel names")
    return names if names is not None else multi_names


def read_hub_file(path: Path) -> HubFile:
    """The footer of one Parquet file (and, without class names, its label column's largest value);
    a ValueError (one line) for a file that is not readable Parquet (a truncated download), that
    lacks the image column, or the label column when it has no caption or multi-label column, or
    whose caption column holds no text."""
    pa, pq = pyarrow()
    try:
        pf = pq.ParquetFile(path)
        schema, meta = pf.schema_arrow, pf.metadata
        features = _features(schema)
        image = _column(path, schema.names, features, "Image", IMAGE_COLUMNS)
        caption, (multi, multi_names) = _caption_column(path, schema), _multi_column(schema, features)
        label = _label_column(path, schema, features, multi, caption)
        classes = _classes(path, features, label, multi, multi_names)
        top = UNLABELED if classes is not None or not (label or multi) else _largest(pf, label or multi)
    except (pa.ArrowException, OSError) as exc:
        raise ValueError(f"{path}: not readable as Parquet ({str(exc).splitlines()[0]}); a truncated download? "
                         f"Fetch it again, or move it out of the folder") from None
    groups = []
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        leaves = (group.column(c) for c in range(group.num_columns))
        groups.append((group.num_rows, sum(c.total_compressed_size for c in leaves
                                           if c.path_in_schema.split(".")[0] == image)))
    return HubFile(path, image, label, classes, groups, caption, multi, top)


def _largest(pf: Any, column: str) -> int:
    """The largest value of an integer column, or of the ids of a list column (-1: none)."""
    pa, _ = pyarrow()
    import pyarrow.compute as pc

    values = pf.read(columns=[column]).column(0)
    top = pc.max(values if pa.types.is_integer(values.type) else pc.list_flatten(values)).as_py()
    return UNLABELED if top is None else int(top)


class Rows(NamedTuple):
    """Rows read from a file: one value a row in each (None where the row, or the file, has none)."""

    labels: np.ndarray  # int64: the label column's, else the smallest id of each list, else -1
    texts: list[str | None]
    ids: list[list[int | None] | None]


def read_rows(source: str | Path | BinaryIO, info: HubFile, group: int | None = None) -> Rows:
    """The labels, captions and multi-label ids of row group `group`'s rows (None: the whole
    file's; not their images: row_group_images); pyarrow's error when they cannot be read."""
    _, pq = pyarrow()
    rows = sum(n for n, _ in info.groups) if group is None else info.groups[group][0]
    columns = [c for c in (info.label, info.caption, info.multi) if c]
    table = None
    if columns:
        pf = pq.ParquetFile(source)
        table = pf.read(columns=columns) if group is None else pf.read_row_group(group, columns=columns)
    none = [None] * rows
    return Rows(_labels(table, info, rows), table.column(info.caption).to_pylist() if info.caption else none,
                table.column(info.multi).to_pylist() if info.multi else none)


def _labels(table: Any, info: HubFile, rows: int) -> np.ndarray:
    """Each row's label (int64): the label column's (null: -1), else its list's smallest id (-1: none)."""
    import pyarrow.compute as pc

    if info.label:
        return pc.fill_null(table.column(info.label), UNLABELED).to_numpy().astype(np.int64)
    out = np.full(rows, UNLABELED, np.int64)
    if info.multi:
        lists = table.column(info.multi).combine_chunks()
        values, parents = pc.list_flatten(lists), pc.list_parent_indices(lists)
        valid = values.is_valid()
        values, parents = values.filter(valid).to_numpy(), parents.filter(valid).to_numpy()
        if len(values):  # a list's ids lie together, its parent index repeated: one reduceat over them
            found, starts = np.unique(parents, return_index=True)
            out[found] = np.minimum.reduceat(values.astype(np.int64), starts)
    return out


def record_fields(text: str | None, ids: list | None, info: HubFile, classes: int | None = None) -> Fields:
    """A row's Fields from its caption and multi-label ids (sorted, unique; a ValueError naming one
    outside `classes`)."""
    labels = multi_labels([v for v in ids or () if v is not None], classes) if info.multi else None
    return Fields(text, None, labels)


def bad_label(label: int, classes: int) -> str | None:
    """Why `label` is not a record's label (-1, or a class id below `classes`); None when it is."""
    if label == UNLABELED or 0 <= label < classes:
        return None
    return f"label {label} is not a class id (0..{classes - 1})"


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
        self._infos = mine  # their footers: nothing a row (labels are read with the row group)
        self.fields = tuple(n for n in FIELD_NAMES if any(n in f.fields for f in mine))
        self._groups = [(n, g) for n, f in enumerate(mine) for g in range(len(f.groups))]
        rows = [rows for f in mine for rows, _ in f.groups]
        self._starts = np.concatenate([[0], np.cumsum(rows)]).astype(np.int64)
        self._file_starts = np.concatenate([[0], np.cumsum([sum(n for n, _ in f.groups) for f in mine])])
        super().__init__(Path(paths[0]).parent, split=split, classes=class_names(files), size=int(self._starts[-1]))
        self._last = PerProcess(dict)  # this process's last row group: {"at": (file, group), "images", "rows"}

    def shard_sizes(self) -> np.ndarray:
        return np.diff(self._starts)

    def _where(self, index: int) -> tuple[int, int, int, int]:
        """Record `index`'s file number, row group number (of all files'), row in its file and in its group."""
        at = bisect.bisect_right(self._starts, index) - 1
        number = self._groups[at][0]
        return number, at, index - int(self._file_starts[number]), index - int(self._starts[at])

    def origin(self, index: int) -> str:
        number, _, row, _ = self._where(self._check(index))
        return f"{self.files[number][0]}#row {row}"

    def _read(self, index: int) -> Record:
        number, at, row, at_row = self._where(index)
        (path, column), info, group = self.files[number], self._infos[number], self._groups[at][1]
        last = self._last.get()
        if last.get("at") != (number, group):
            last.clear()  # one row group in memory
            last.update(at=(number, group), images=row_group_images(path, group, column),
                        rows=read_rows(path, info, group))
        rows, origin = last["rows"], f"{path}#row {row}"
        label = int(rows.labels[at_row])
        try:
            fields = record_fields(rows.texts[at_row], rows.ids[at_row], info, len(self.classes))
            reason = bad_label(label, len(self.classes))
        except ValueError as exc:  # an id beyond the class names: a bad record, not the loader's IndexError
            reason = f"in its multi-label column {info.multi!r}, {exc}"
        if reason:
            raise ValueError(f"{origin}: {reason} (`datapipe convert` skips such rows)")
        key = make_key(f"{Path(path).stem}/{row:08d}", set())
        return Record(key, last["images"][at_row] or b"", label, origin, "", fields)
