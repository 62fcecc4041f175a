"""The `parquet` fuzz target: the Hub-layout Parquet reader (datapipe.formats.parquet) read in place
and its converter's task list, against a memory bound on the process's peak RSS (pyarrow's buffers are
invisible to tracemalloc). fuzz/targets.py registers it."""
from __future__ import annotations

import atexit
import io
import json
import shutil
import tempfile
import time
from pathlib import Path

from fuzz.contract import Finding, Target, timed


PARQUET_MEMORY = 256 << 20  # bytes of peak RSS growth allowed per input (+ 64 a byte of input): the inferred
# class list at its cap (records.MAX_INFERRED_CLASSES: 10^6 names, ~63 MB) fits; pyarrow's buffers count too
_PARQUET_DIR: Path | None = None


def parquet_seeds() -> list[bytes]:
    """Small Hub-layout files: ClassLabel names and Image structs (uncompressed, plain: a mutation
    lands in the values), no metadata with a uint8 label and a caption that is not UTF-8, and a
    Sequence(ClassLabel) list column with captions (snappy, dictionary-encoded)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    image = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    images = [{"bytes": f"img{i}".encode(), "path": f"{i}.jpg"} for i in range(6)]
    hub = {"image": {"_type": "Image"}, "label": {"_type": "ClassLabel", "names": ["dog", "cat", "fish"]},
           "tags": {"_type": "Sequence", "feature": {"_type": "ClassLabel", "names": ["a", "b", "c", "d"]}}}
    meta = {b"huggingface": json.dumps({"info": {"features": hub}}).encode()}
    tables = [
        (pa.table({"image": pa.array(images, image), "label": pa.array([0, 1, 2, 0, -1, None], pa.int64())},
                  schema=pa.schema([("image", image), ("label", pa.int64())], metadata=meta)),
         dict(compression="none", use_dictionary=False, row_group_size=3)),
        (pa.table({"image": pa.array([f"img{i}".encode() for i in range(4)], pa.binary()),
                   "label": pa.array([3, None, 0, 250], pa.uint8()),
                   "caption": pa.array([b"one", b"\xff two", None, b"four"], pa.binary()).view(pa.string())}),
         dict(compression="none", row_group_size=2)),
        (pa.table({"image": pa.array(images, image), "caption": pa.array([f"c {i}" for i in range(6)]),
                   "tags": pa.array([[0, 1], [], None, [3], [2, 9], [1]], pa.list_(pa.int64()))},
                  schema=pa.schema([("image", image), ("caption", pa.string()), ("tags", pa.list_(pa.int64()))],
                                   metadata=meta)),
         dict(compression="snappy", row_group_size=4)),
    ]
    out = []
    for table, options in tables:
        buf = io.BytesIO()
        pq.write_table(table, buf, **options)
        out.append(buf.getvalue())
    return out


def _peak_rss() -> int | None:
    """This process's peak resident memory in bytes since the last _reset_peak_rss (None: not on Linux)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            return next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmHWM:"))
    except (OSError, StopIteration, ValueError):
        return None


def _reset_peak_rss() -> int | None:
    """Reset the peak (Linux: clear_refs 5) and return the resident memory now; None where that fails."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
            fh.write("5")
    except OSError:
        return None
    return _peak_rss()


def check_parquet(data: bytes) -> None:
    """The input as `train-00000-of-00001.parquet`: opened in place (ParquetDataset: footer, column
    types, classes) and its first records read, then listed for conversion (converters.parquet:
    every row's label, caption and ids) and its first rows' images read as a worker does. Opening
    and listing raise ValueError (the one-line errors) or succeed; a record raises ValueError (a
    bad record), OSError or a pyarrow error (a row group that cannot be read: the loader's on_error
    serves around it); a worker's row read, BadImageError. In time (CPU), and within PARQUET_MEMORY
    of peak RSS (pyarrow's buffers are outside tracemalloc's view)."""
    import pyarrow as pa

    from converters.inputs import open_input
    from converters.parquet import scan_parquet
    from datapipe.formats.parquet import ParquetDataset
    from datapipe.image.headers import BadImageError

    global _PARQUET_DIR
    if _PARQUET_DIR is None:
        _PARQUET_DIR = Path(tempfile.mkdtemp(prefix="datapipe-fuzz-parquet-"))
        atexit.register(shutil.rmtree, _PARQUET_DIR, True)
    path = _PARQUET_DIR / "train-00000-of-00001.parquet"
    path.write_bytes(data)
    base, start = _reset_peak_rss(), time.process_time()
    try:
        ds = ParquetDataset(str(path))
    except ValueError:
        ds = None
    for i in range(min(len(ds), 8) if ds is not None else 0):
        try:
            ds.record(i)
        except (ValueError, OSError, pa.ArrowException):
            pass
    try:
        layout = scan_parquet(path)
    except ValueError:
        layout = None
    for file in (layout.splits.get("train", [])[:8] if layout is not None else ()):
        try:
            with open_input(file.path) as fh:
                fh.read()
        except BadImageError:
            pass
    timed("parquet", start)
    peak = _peak_rss()
    if base is not None and peak is not None and peak - base > PARQUET_MEMORY + 64 * len(data):
        raise Finding(f"parquet: peak RSS grew {(peak - base) >> 20} MiB for a {len(data)}-byte input")


TARGET = Target("parquet", check_parquet, parquet_seeds, (
    "datapipe.formats.parquet", "datapipe.formats.parquet_schema", "converters.parquet"))
