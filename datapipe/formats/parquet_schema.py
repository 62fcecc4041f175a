"""What a Parquet file in the Hugging Face Hub's layout holds, from its footer: its split, its
columns (chosen by the rules in datapipe.formats.parquet's docstring and typed before any row is
read: a wrong type is one line naming the file, the column and what is expected) and its classes,
and the one class list of a set of files (`resolve_classes`: another file's names in another order
are mapped onto it by name; another set of names is refused). Files are opened by `open_regular`:
regular files only, without blocking, whatever bytes their names hold.
"""
from __future__ import annotations

import json
import logging
import os
import re
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, BinaryIO, Iterator

from ..errors import summary
from ..records import MAX_INFERRED_CLASSES, inferred_class_names
from ..storage import dataset_files
from .scan import printable

log = logging.getLogger(__name__)
IMAGE_COLUMNS, LABEL_COLUMNS, CAPTION_COLUMNS = ("image", "img"), ("label", "labels"), ("caption", "text")
_SEQUENCES = ("Sequence", "List", "LargeList")  # the Hub's list features, across `datasets` versions
_SPLIT = re.compile(r"^(train|training|validation|valid|val|test|testing)(?=[-_.]|$)", re.IGNORECASE)
_SPLIT_NAMES = {"training": "train", "validation": "val", "valid": "val", "testing": "test"}
UNLABELED = -1  # the Hub's label of a row without one (test splits)
_INT64_MAX = (1 << 63) - 1
_SHOWN = 80  # characters of a column type or class name in a message


def pyarrow() -> tuple[Any, Any]:
    """pyarrow and pyarrow.parquet, imported when a Parquet file is met (nothing else needs them)."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise ImportError("reading Parquet files needs pyarrow: pip install 'datapipe[parquet]'") from None
    return pa, pq


def shown(text: object, limit: int = _SHOWN) -> str:
    """`text` for a one-line message: valid UTF-8 (a file name's undecodable bytes as \\xNN, as
    datapipe.formats.scan.printable writes them) and at most `limit` characters."""
    text = printable(str(text))
    return text if len(text) <= limit else text[: limit - 3] + "..."


def open_regular(path: str | Path) -> BinaryIO:
    """`path` opened for reading when it is a regular file (a link to one too), through the one open of
    a dataset's files (dataset_files.open_regular: a FIFO matched by `*.parquet` would block open()
    forever, /dev/zero read forever); a ValueError naming it otherwise. A name that is not UTF-8 opens
    (pyarrow would refuse it: it is given the open file)."""
    try:
        fd = dataset_files.open_regular(os.fsdecode(path), what="Parquet file",
                                        fix="move it out of the folder or out of the pattern")
    except dataset_files.BadDatasetFile as exc:
        raise ValueError(f"{shown(path, 300)} {exc.reason}") from None
    return os.fdopen(fd, "rb")


@contextmanager
def parquet_file(source: str | Path | BinaryIO) -> Iterator[Any]:
    """A pyarrow ParquetFile over `source`: a path (opened by open_regular, closed after) or an open file."""
    _, pq = pyarrow()
    if not isinstance(source, (str, Path)):
        yield pq.ParquetFile(source)
        return
    with open_regular(source) as fh:
        yield pq.ParquetFile(fh)


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
    groups: list[tuple[int, int]]  # (rows, bytes: the footer's total_byte_size) per row group
    caption: str | None = None  # the caption column (Fields.text)
    multi: str | None = None  # the multi-label column: a list of class ids a row (Fields.labels)
    top: int = UNLABELED  # without class names: the largest label (or id of a list, without a label column)
    remap: tuple[int, ...] | None = None  # its class ids' places in the chosen classes (its names in another order)

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
        listed = ", ".join(shown(n, 40) for n in names[:8])
        listed += f", ... ({len(names):,} columns)" if len(names) > 8 else ""
        raise ValueError(f"{shown(path, 300)}: no {fallback[0]!r} column ({kind}; looked for {', '.join(fallback)}); "
                         f"its columns are {listed or 'none'}. Convert Parquet files with an image and a label "
                         "(or caption) column")
    return found[0]


def _is_binary(kind: Any) -> bool:
    pa, _ = pyarrow()
    return bool(pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or pa.types.is_fixed_size_binary(kind)
                or pa.types.is_binary_view(kind))


def _image_column(path: Path, schema: Any, features: dict[str, Any]) -> str:
    """The image column: binary, or the Hub's Image struct whose `bytes` field is binary; a ValueError
    naming the file, the column and its type otherwise (read as it is, a wrong type failed in pyarrow
    or served numbers as images)."""
    pa, _ = pyarrow()
    name = _column(path, schema.names, features, "Image", IMAGE_COLUMNS)
    kind = schema.field(name).type
    struct = pa.types.is_struct(kind)
    if not _is_binary(kind.field("bytes").type if struct and kind.get_field_index("bytes") >= 0 else kind):
        raise ValueError(f"{shown(path, 300)}: the image column {shown(repr(name))} holds {shown(kind)}, not image "
                         "bytes: expected binary, or the Hub's Image struct {bytes: binary, path: string}"
                         + (" (a struct without binary `bytes` holds no image: the file refers to images "
                            "elsewhere; store them in it)" if struct else ""))
    return name


def _caption_column(path: Path, schema: Any) -> str | None:
    """The caption column (the first of CAPTION_COLUMNS), None without one; a ValueError naming it
    when it does not hold strings."""
    pa, _ = pyarrow()
    name = next((n for n in CAPTION_COLUMNS if n in schema.names), None)
    if name is not None and not (pa.types.is_string(schema.field(name).type)
                                 or pa.types.is_large_string(schema.field(name).type)):
        raise ValueError(f"{shown(path, 300)}: the caption column {name!r} holds {shown(schema.field(name).type)}, "
                         "not strings; "
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
        raise ValueError(f"{shown(path, 300)}: the label column {shown(repr(label))} holds "
                         f"{shown(schema.field(label).type)}, not integers; convert Parquet files whose labels are "
                         "class ids")
    return label


def _classes(path: Path, features: dict[str, Any], label: str | None, multi: str | None,
             multi_names: list[str] | None) -> list[str] | None:
    """The class names of the metadata, by the module's rule: the label column's, else the
    multi-label sequence's; a ValueError when both name classes and they differ."""
    named = features.get(label) if label else None
    names = named.get("names") if isinstance(named, dict) else None
    names = [str(n) for n in names] if isinstance(names, list) else None
    if names is not None and multi_names is not None and names != multi_names:
        raise ValueError(f"{shown(path, 300)}: the label column {shown(repr(label))} and the multi-label column "
                         f"{shown(repr(multi))} name different classes ({_first_difference(names, multi_names)}); "
                         "one list of classes serves both: drop one of the columns, or give them the same ClassLabel "
                         "names")
    names = names if names is not None else multi_names
    if names is not None and len(set(names)) != len(names):
        seen: set[str] = set()
        twice = [n for n in names if n in seen or seen.add(n)]  # type: ignore[func-returns-value]
        twice_said = summary(twice, "name given twice", "names given twice")
        raise ValueError(f"{shown(path, 300)}: its ClassLabel names are not unique ({twice_said}); a label must "
                         "name one class: fix the dataset's features")
    return names


def read_hub_file(path: Path) -> HubFile:
    """The footer of one Parquet file (and, without class names, its label column's largest value);
    a ValueError (one line) for a file that is not a regular file, not readable Parquet (a truncated
    download), that lacks the image column, or the label column when it has no caption or
    multi-label column, or whose columns hold the wrong types."""
    pa, _ = pyarrow()
    try:
        with parquet_file(path) as pf:
            schema, meta = pf.schema_arrow, pf.metadata
            features = _features(schema)
            image = _image_column(path, schema, features)
            caption, (multi, multi_names) = _caption_column(path, schema), _multi_column(schema, features)
            label = _label_column(path, schema, features, multi, caption)
            classes = _classes(path, features, label, multi, multi_names)
            top = UNLABELED if classes is not None or not (label or multi) else _largest(pf, label or multi)
    except (pa.ArrowException, OSError) as exc:
        raise ValueError(f"{shown(path, 300)}: not readable as Parquet ({shown(str(exc).splitlines()[0], 200)}); "
                         "a truncated download? Fetch it again, or move it out of the folder") from None
    groups = []
    for g in range(meta.num_row_groups):
        # the row group's bytes, not its image column's: pyarrow's RowGroupMetaData.column() aborts the
        # process (std::terminate) on a column chunk whose size statistics do not fit the schema (fuzzed)
        group = meta.row_group(g)
        if group.num_rows < 0:
            raise ValueError(f"{shown(path, 300)}: its footer gives row group {g} {group.num_rows:,} rows: the file "
                             "is damaged; fetch it again")
        groups.append((group.num_rows, group.total_byte_size))
    return HubFile(path, image, label, classes, groups, caption, multi, top)


def _largest(pf: Any, column: str) -> int:
    """The largest value of an integer column, or of the ids of a list column, below
    MAX_INFERRED_CLASSES (-1: none): the classes "0" .. it are built (records.inferred_class_names),
    and a row with an id past the cap is a bad record, never a class list of that length."""
    pa, _ = pyarrow()
    import pyarrow.compute as pc

    values = pf.read(columns=[column]).column(0)
    values = signed(values if pa.types.is_integer(values.type) else pc.list_flatten(values))
    top = pc.max(pc.filter(values, pc.less(values, MAX_INFERRED_CLASSES))).as_py()
    return UNLABELED if top is None else int(top)


def signed(values: Any) -> Any:
    """An integer column as int64 (its nulls kept): an unsigned one is cast first (fill_null(-1) on it
    overflowed), a uint64 value past int64 clipped to int64's largest (still no class id)."""
    pa, _ = pyarrow()
    import pyarrow.compute as pc

    if values.type == pa.uint64():
        values = pc.min_element_wise(values, pa.scalar(_INT64_MAX, pa.uint64()), skip_nulls=False)
    return values.cast(pa.int64())


def _first_difference(names: list[str], other: list[str]) -> str:
    """How two lists of class names differ, in a few words: their lengths and the first name one has
    and the other lacks, or the first place they differ (never the whole lists: they may be long)."""
    theirs, mine = set(other), set(names)
    extra = next((n for n in names if n not in theirs), None)
    missing = next((n for n in other if n not in mine), None)
    at = next((n for n, (a, b) in enumerate(zip(names, other)) if a != b), min(len(names), len(other)))
    first = (f"{shown(repr(extra), 60)} is not in the other" if extra is not None else
             f"{shown(repr(missing), 60)} is missing" if missing is not None else
             f"class {at} is {shown(repr(names[at]), 60)} in one, {shown(repr(other[at]), 60)} in the other"
             if at < min(len(names), len(other)) else "a name is repeated")
    return f"{len(names):,} names against {len(other):,}; the first difference: {first}"


def _matched(info: HubFile, chosen: HubFile) -> HubFile:
    """`info` with its class ids mapped onto `chosen`'s class names, when its names are the same in
    another order; a ValueError naming both files when they are another set of names."""
    names, target = info.classes, chosen.classes
    if names is None or target is None or names == target:
        return info
    if len(names) != len(target) or sorted(names) != sorted(target) or len(set(names)) != len(names):
        raise ValueError(f"{shown(info.path, 300)}: its class names are not those of {shown(chosen.path, 300)} "
                         f"({_first_difference(names, target)}); every split's files must name the same classes")
    log.info("%s: its class names are %s's in another order: its labels are mapped onto them by name",
             shown(info.path, 300), shown(chosen.path, 300))
    place = {name: n for n, name in enumerate(target)}
    return replace(info, remap=tuple(place[name] for name in names))


def resolve_classes(files: list[HubFile]) -> tuple[list[str], list[HubFile]]:
    """The classes of a set of files (every split's): the ClassLabel names in the metadata (a train
    file's first), else "0" .. the largest class id (bounded: records.inferred_class_names); and the
    files, each whose names are the same in another order with its ids mapped onto them (`remap`).
    A ValueError (one line) for a file naming another set of classes: its labels would be wrong."""
    ordered = sorted(files, key=lambda f: split_of(f.path) != "train")
    chosen = next((f for f in ordered if f.classes is not None), None)
    if chosen is not None and chosen.classes is not None:
        return chosen.classes, [_matched(f, chosen) for f in files]
    top = max((f.top for f in files), default=UNLABELED)
    log.info("no class names in the Parquet metadata: the classes are the labels 0..%d as text", top)
    return inferred_class_names(top), files
