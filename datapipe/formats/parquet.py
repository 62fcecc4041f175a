"""Parquet files in the Hugging Face Hub's layout: what their columns, splits and classes are, and
their rows read in place (`open_dataset("data/*.parquet", "val")`, `make_loader(...)`).

A Hub image dataset is Parquet files named by split (`train-00000-of-00257.parquet`, `validation-…`
read as our `val` like a folder's, `test-…`; or files under `train/`, `validation/` folders), each
holding an image column (a struct `{bytes, path}`: the encoded file) and an integer label column.
The `huggingface` entry of the Arrow schema's metadata names the features: the `Image` column and
the `ClassLabel` column with its class names, kept in the Hub's order so labels stay the Hub's ids.
Without it the columns named `image`/`img` and `label`/`labels` are taken, and the classes are "0" ..
the largest label (ids from records.MAX_INFERRED_CLASSES on: bad rows, never classes). A label of
-1 (the Hub's test splits) is kept: a split without labels. Every file's ClassLabel names are
compared with the chosen ones: the same in another order are mapped by name, others refused
(datapipe.formats.parquet_schema, which also types each column before a row is read).

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
and the id (a bad record: the loader's on_error policy serves around it), as is a label outside them
and a caption that is not UTF-8 (captions are read as bytes and decoded a row at a time).

Read in place, a record is a row: the reader keeps the last row group it read, per process (its
images, labels, captions and ids: nothing a row is held beyond it, so a worker is sent no per-row
array), so reading in row-group order is fast and random access across row groups reads one row
group a record. Give `sampling="shards"` (each row group is a shard) or convert the files first
(`datapipe convert data/ out.wds`, converters.parquet), which also validates every image.
"""
from __future__ import annotations

import bisect
import glob
import os
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

import numpy as np

from ..records import FIELD_NAMES, MAX_INFERRED_CLASSES, Fields, Record, SplitNotFound, multi_labels
from .base import Dataset, PerProcess
from .parquet_schema import (UNLABELED, HubFile, open_regular, parquet_file, pyarrow, read_hub_file, resolve_classes,
                             shown, signed, split_of)
from .scan import make_key, printable

NAME = "parquet"


class Rows(NamedTuple):
    """Rows read from a file: one value a row in each (None where the row, or the file, has none)."""

    labels: np.ndarray  # int64: the label column's, else the smallest id of each list, else -1
    texts: list[bytes | None]  # the captions as stored (UTF-8 or not: decoded a row at a time, row_record)
    ids: list[list[int | None] | None]


def read_rows(source: str | Path | BinaryIO, info: HubFile, group: int | None = None) -> Rows:
    """The labels, captions and multi-label ids of row group `group`'s rows (None: the whole
    file's; not their images: row_group_images), the ids as the chosen classes number them
    (`info.remap`); pyarrow's error when they cannot be read, a ValueError naming the file when
    they are another number of rows than its footer says (a damaged file)."""
    pa, _ = pyarrow()
    rows = sum(n for n, _ in info.groups) if group is None else info.groups[group][0]
    columns = [c for c in (info.label, info.caption, info.multi) if c]
    table = None
    if columns:
        with parquet_file(source) as pf:
            table = pf.read(columns=columns) if group is None else pf.read_row_group(group, columns=columns)
        _check_rows(info, group, table.num_rows, ", ".join(map(repr, columns)))
    none: list[Any] = [None] * rows
    texts = none
    if info.caption:  # as bytes: one caption that is not UTF-8 is its row's problem, not the row group's
        column = table.column(info.caption)
        texts = column.cast(pa.large_binary() if pa.types.is_large_string(column.type) else pa.binary()).to_pylist()
    ids = table.column(info.multi).to_pylist() if info.multi else none
    if info.remap is not None and info.multi:
        ids = [None if row is None else [_remapped_id(v, info.remap) for v in row] for row in ids]
    return Rows(_labels(table, info, rows), texts, ids)


def _check_rows(info: HubFile, group: int | None, found: int, columns: str) -> None:
    """A ValueError naming the file when `found` values were read where its footer says otherwise:
    a record would be another row's, or none."""
    want = sum(n for n, _ in info.groups) if group is None else info.groups[group][0]
    if found != want:
        where = "its rows" if group is None else f"row group {group}"
        raise ValueError(f"{shown(info.path, 300)}: {where} hold {found:,} values in column(s) {shown(columns)} where "
                         f"its footer says {want:,} rows: the file is damaged; fetch it again")


def _remapped_id(value: int | None, remap: tuple[int, ...]) -> int | None:
    return remap[value] if value is not None and 0 <= value < len(remap) else value


def _remapped(ids: np.ndarray, remap: tuple[int, ...] | None) -> np.ndarray:
    """Class ids (int64) as the chosen classes number them; ids outside the file's classes kept (still bad)."""
    if remap is None or not len(ids):
        return ids
    table = np.asarray(remap, np.int64)
    inside = (ids >= 0) & (ids < len(table))
    return np.where(inside, table[np.clip(ids, 0, len(table) - 1)], ids)


def _labels(table: Any, info: HubFile, rows: int) -> np.ndarray:
    """Each row's label (int64): the label column's (null: -1), else its list's smallest id (-1: none)."""
    import pyarrow.compute as pc

    if info.label:
        labels = pc.fill_null(signed(table.column(info.label)), UNLABELED).to_numpy().astype(np.int64)
        return _remapped(labels, info.remap)
    out = np.full(rows, UNLABELED, np.int64)
    if info.multi:
        lists = table.column(info.multi).combine_chunks()
        values, parents = signed(pc.list_flatten(lists)), pc.list_parent_indices(lists)
        valid = values.is_valid()
        values, parents = values.filter(valid).to_numpy(), parents.filter(valid).to_numpy()
        if len(values):  # a list's ids lie together, its parent index repeated: one reduceat over them
            found, starts = np.unique(parents, return_index=True)
            out[found] = np.minimum.reduceat(_remapped(values.astype(np.int64), info.remap), starts)
    return out


def row_record(rows: Rows, at: int, info: HubFile, classes: int) -> tuple[int, Fields]:
    """Row `at`'s label and Fields (its caption decoded, its multi-label ids sorted and unique); a
    ValueError saying why the row is no record: a label or id outside the classes, a caption that
    is not UTF-8 (read in place, a bad record; converted, a skipped row)."""
    label = int(rows.labels[at])
    reason = bad_label(label, classes)
    if reason:
        raise ValueError(reason)
    raw, text = rows.texts[at], None
    if raw is not None:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"its caption (column {info.caption!r}) is not UTF-8: {exc.reason} at byte {exc.start} "
                             "(store the captions as UTF-8 text)") from None
    labels = None
    if info.multi:
        try:
            labels = multi_labels([v for v in rows.ids[at] or () if v is not None], classes)
        except ValueError as exc:
            raise ValueError(f"in its multi-label column {info.multi!r}, {exc}") from None
    return label, Fields(text, None, labels)


def bad_label(label: int, classes: int) -> str | None:
    """Why `label` is not a record's label (-1, or a class id below `classes`); None when it is."""
    if label == UNLABELED or 0 <= label < classes:
        return None
    past = f"; ids from {MAX_INFERRED_CLASSES:,} on are never classes without class names (datapipe.records." \
        "MAX_INFERRED_CLASSES)" if label >= MAX_INFERRED_CLASSES else ""
    return f"label {label} is not a class id (0..{classes - 1}){past}"


def row_group_images(source: str | BinaryIO, group: int, column: str) -> list[bytes | None]:
    """The image bytes of each row of row group `group` (None: a null image); pyarrow's error when
    the row group cannot be read. The column's type was checked when its file was opened
    (read_hub_file)."""
    pa, _ = pyarrow()
    with parquet_file(source) as pf:
        values = pf.read_row_group(group, columns=[column]).column(0)
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
        if not paths or not os.path.exists(paths[0]):
            raise FileNotFoundError(f"no Parquet file matches {shown(pattern, 300)}")
        every = [read_hub_file(Path(p)) for p in paths]  # every split's: the classes are train's
        classes, files = resolve_classes(every)
        mine = [f for f in files if split_of(f.path) == split]
        if not mine:
            found = ", ".join(sorted({split_of(f.path) for f in files}))
            raise SplitNotFound(f"split {split!r} not in {shown(pattern, 300)}: its files hold {found} (split from the "
                                "file names)")
        self.files = [(str(f.path), f.image) for f in mine]
        self._infos = mine  # their footers: nothing a row (labels are read with the row group)
        self.fields = tuple(n for n in FIELD_NAMES if any(n in f.fields for f in mine))
        self._groups = [(n, g) for n, f in enumerate(mine) for g in range(len(f.groups))]
        rows = [rows for f in mine for rows, _ in f.groups]
        self._starts = np.concatenate([[0], np.cumsum(rows)]).astype(np.int64)
        self._file_starts = np.concatenate([[0], np.cumsum([sum(n for n, _ in f.groups) for f in mine])])
        super().__init__(Path(paths[0]).parent, split=split, classes=classes, size=int(self._starts[-1]))
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
        return f"{printable(self.files[number][0])}#row {row}"

    def _read(self, index: int) -> Record:
        number, at, row, at_row = self._where(index)
        (path, column), info, group = self.files[number], self._infos[number], self._groups[at][1]
        last = self._last.get()
        if last.get("at") != (number, group):
            last.clear()  # one row group in memory
            with open_regular(path) as fh:
                images, rows = row_group_images(fh, group, column), read_rows(fh, info, group)
            _check_rows(info, group, len(images), repr(column))
            last.update(at=(number, group), images=images, rows=rows)
        rows, origin = last["rows"], f"{printable(path)}#row {row}"
        try:
            label, fields = row_record(rows, at_row, info, len(self.classes))
        except ValueError as exc:  # a bad record (the loader's on_error policy), not the loader's IndexError
            raise ValueError(f"{origin}: {exc} (`datapipe convert` skips such rows)") from None
        key = make_key(printable(f"{Path(path).stem}/{row:08d}"), set())
        return Record(key, last["images"][at_row] or b"", label, origin, "", fields)
