"""`datapipe convert data/ out.wds` from Parquet files in the Hugging Face Hub's layout.

The layout (splits from the file names, the image and label columns, the class names from the
schema's metadata, label -1 for a split without labels) is datapipe.formats.parquet's, and so are the
fields beside them: a caption column (`caption`/`text`) becomes each record's `Fields.text`, a
multi-label column (`Sequence(ClassLabel)`, or `labels` holding id lists) its `Fields.labels`; both
are small and read here, at scan time, so the task list's fingerprint and the record digests cover them.
Which column gives the label and the classes when a file has a label and a list column is that
module's rule; a row whose label or list holds an id outside the classes is skipped with its reason.

The scan reads only each file's footer and its label, caption and multi-label columns. Each row
becomes a task whose path is a `ParquetRow` (converters.members): workers read its row group when
they first need one of its rows and keep that one row group (bounded memory: one per process), so
tasks go in row-group order: for a .wds output the seed shuffles the row groups and the rows inside
each, not all rows at once.
A file that is not readable Parquet (a truncated download) or lacks a column stops the scan with one
line; a bad image is skipped and listed as `FILE#row N` like a folder's bad file.
"""
from __future__ import annotations

import logging
import os
import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, BinaryIO

from datapipe.formats.parquet import Rows, read_rows, row_group_images, row_record
from datapipe.formats.parquet_schema import UNLABELED, HubFile, pyarrow, read_hub_file, resolve_classes, shown, split_of
from datapipe.errors import counted
from datapipe.image.headers import BadImageError
from datapipe.records import ClassIndex
from datapipe.formats.scan import SPLIT_NAMES, FolderLayout, ImageFile, make_key, printable

from .members import Member

log = logging.getLogger(__name__)
FOOTER_THREADS = 8
_CACHE: dict[str, Any] = {}  # per process: the last row group read, {"key": ..., "rows": [bytes | None]}


class ParquetRow(Member):
    """Row `row` (of the file) in row group `group` of Parquet file `archive`, image column `column`."""

    __slots__ = ("group", "first", "row", "column")

    def __new__(cls, archive: str, group: int, first: int, row: int, column: str) -> "ParquetRow":
        self = super().__new__(cls, f"{archive}#row {row}")
        self.archive, self.group, self.first, self.row, self.column = archive, group, first, row, column
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        return ParquetRow, (self.archive, self.group, self.first, self.row, self.column)

    def opened(self, archive: BinaryIO) -> "RowFile":
        return RowFile(archive, self)


class RowFile:
    """A Parquet row opened for reading: `read()` gives its image bytes from its row group (read
    once per process and kept until another is needed); `fileno()` is the file's, whose identity
    stands for the row's, like an archive member's (converters.members.MemberFile)."""

    def __init__(self, archive: BinaryIO, row: ParquetRow) -> None:
        self.archive, self.row = archive, row

    def read(self) -> bytes:
        st = os.fstat(self.archive.fileno())
        key = (self.row.archive, st.st_ino, st.st_size, st.st_mtime_ns, self.row.group, self.row.column)
        if _CACHE.get("key") != key:
            _CACHE.clear()  # drop the last row group before reading the next: one in memory
            _CACHE.update(key=key, rows=_read_group(self.archive, self.row))
        rows = _CACHE["rows"]
        index = self.row.row - self.row.first
        if not 0 <= index < len(rows):
            raise BadImageError(f"row group {self.row.group} has {len(rows)} rows now: the file changed since the scan")
        if rows[index] is None:
            raise BadImageError(f"no image bytes in column {self.row.column!r} (null, or a path only)")
        return rows[index]  # type: ignore[no-any-return]

    def fileno(self) -> int:
        return self.archive.fileno()

    def close(self) -> None:
        self.archive.close()

    def __enter__(self) -> "RowFile":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _read_group(fh: BinaryIO, row: ParquetRow) -> list[bytes | None]:
    """The image bytes of each row of `row`'s row group; BadImageError when it cannot be read."""
    pa, _ = pyarrow()
    try:
        return row_group_images(fh, row.group, row.column)
    except (pa.ArrowException, OSError) as exc:
        raise BadImageError(f"row group {row.group} cannot be read: {exc}") from None


def parquet_files(src: str | Path) -> list[Path] | None:
    """The Parquet files of `src`: a .parquet file, or those in the folder, in its `data/` folder (at
    any depth) and in its split-named folders (`train/`, `validation/`, ...); None when there are
    none. Class folders are not listed: an image folder costs no extra walk."""
    root = Path(src)
    if root.is_file():
        return [root] if root.suffix.lower() == ".parquet" else None
    if not root.is_dir():
        return None
    folders = [root] + [p for p in root.iterdir() if p.name.lower() in SPLIT_NAMES and p.is_dir()]
    found = {p for folder in folders for p in folder.iterdir() if p.suffix.lower() == ".parquet" and p.is_file()}
    if (root / "data").is_dir():
        found |= {p for p in (root / "data").rglob("*") if p.suffix.lower() == ".parquet" and p.is_file()}
    return sorted(found) or None


def _rows(info: HubFile, root: Path, classes: ClassIndex, taken: set[str],
          skipped: list[dict[str, str]]) -> list[list[ImageFile]]:
    """Each row group's rows of one file as ImageFiles, with their caption and multi-labels; rows
    with a label outside the classes or a caption that is not UTF-8 go to `skipped`. A file name
    that is not UTF-8 is shown with \\xNN escapes (datapipe.formats.scan.printable), as a folder's."""
    rel = printable(info.path.relative_to(root).as_posix() if info.path != root else info.path.name)
    stem = rel[: -len(".parquet")] if rel.lower().endswith(".parquet") else rel
    data = _file_rows(info)
    out, first = [], 0
    for group, (rows, size) in enumerate(info.groups):
        files = []
        for row in range(first, first + rows):
            relpath = f"{rel}#row {row}"
            try:
                label, fields = row_record(data, row, info, len(classes))
            except ValueError as exc:  # a label or id outside the classes, a caption that is not UTF-8
                skipped.append({"path": relpath, "reason": str(exc)})
                continue
            path = ParquetRow(str(info.path), group, first, row, info.image)
            files.append(ImageFile(path, relpath, label, make_key(f"{stem}/{row:08d}", taken),  # type: ignore[arg-type]
                                   max(1, size // max(1, rows)), fields))
        out.append(files)
        first += rows
    return out


def _file_rows(info: HubFile) -> Rows:
    """The labels, captions and multi-label id lists of every row of the file (not its images); a
    ValueError (one line) when they cannot be read."""
    pa, _ = pyarrow()
    try:
        return read_rows(info.path, info)
    except (pa.ArrowException, OSError) as exc:
        columns = [c for c in (info.label, info.caption, info.multi) if c]
        raise ValueError(f"{shown(info.path, 300)}: its {' and '.join(map(repr, columns))} column(s) cannot be read "
                         f"({shown(str(exc).splitlines()[0], 200)}); a truncated download? Fetch it again") from None


def scan_parquet(src: str | Path, *, split: str | None = None, shuffle_seed: int | None = None) -> FolderLayout | None:
    """The Parquet files of `src` as a scanned folder (None: it holds none), each split's rows in
    file, row group and row order, or, with `shuffle_seed`, its row groups and the rows inside each
    shuffled (a worker keeps one row group: a full shuffle would read one per row)."""
    files = parquet_files(src)
    if files is None:
        return None
    root = Path(src) if Path(src).is_dir() else Path(src).parent
    wanted = [f for f in files if split is None or split_of(f) == split]
    if not wanted:
        found = sorted({split_of(f) for f in files})
        raise ValueError(f"--split {split!r}: the Parquet files in {src} hold the splits {', '.join(found)}; "
                         "pick one of them, or leave --split out to convert all")
    log.info("%s: %s (Hugging Face layout)", src, counted(len(wanted), "Parquet file"))
    with ThreadPoolExecutor(min(FOOTER_THREADS, len(files))) as pool:
        every = list(pool.map(read_hub_file, files))  # every split's: the classes are the train split's
    names, every = resolve_classes(every)
    classes = ClassIndex(names)
    infos = [info for info in every if info.path in wanted]
    splits: dict[str, list[list[ImageFile]]] = {}
    skipped: dict[str, list[dict[str, str]]] = {}
    taken: set[str] = set()
    for info in infos:
        name = split_of(info.path)
        splits.setdefault(name, []).extend(_rows(info, root, classes, taken, skipped.setdefault(name, [])))
    for name, groups in splits.items():
        if all(f.label == UNLABELED for g in groups for f in g) and any(groups):
            log.info("split %r has no labels (every row's label is -1): its records keep label -1", name)
        if shuffle_seed is not None:
            rng = random.Random(f"{shuffle_seed}/{name}")
            rng.shuffle(groups)
            for g in groups:
                rng.shuffle(g)
    return FolderLayout(root, classes, {n: [f for g in groups for f in g] for n, groups in splits.items()}, skipped)
