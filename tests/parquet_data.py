"""Parquet files in the Hugging Face Hub's layout, made from the fixture images: for the converter's
tests and the docs' blocks (`datapipe convert data/ cifar10.wds`)."""
from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from datapipe.formats.scan import is_image_name
from tests.conftest import BAD_FILES, IMAGEFOLDER

CLASSES = ["dog", "cat", "fish"]  # the Hub's ClassLabel order, not sorted: it must be kept
TRAIN, VAL, TEST = "train-00000-of-00001.parquet", "validation-00000-of-00001.parquet", "test-00000-of-00001.parquet"
IMAGE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])


def fixture_rows() -> list[tuple[str, bytes, int]]:
    """(relative path, bytes, label) of every image-named file of the fixture folder's train split."""
    root = IMAGEFOLDER / "train"
    return [(p.relative_to(IMAGEFOLDER).as_posix(), p.read_bytes(), CLASSES.index(c)) for c in CLASSES
            for p in sorted((root / c).rglob("*")) if p.is_file() and is_image_name(p.name)]


def hub_table(rows: list[tuple[str, bytes, int]], *, names: list[str] | None = CLASSES) -> pa.Table:
    """The rows as the Hub writes them: an Image struct column, a ClassLabel column, the features in
    the schema's `huggingface` metadata (none when `names` is None)."""
    features = {"image": {"_type": "Image"}, "label": {"_type": "ClassLabel", "names": names}}
    metadata = {b"huggingface": json.dumps({"info": {"features": features}}).encode()} if names else None
    schema = pa.schema([("image", IMAGE), ("label", pa.int64())], metadata=metadata)
    return pa.table({"image": [{"bytes": b, "path": Path(p).name} for p, b, _ in rows],
                     "label": [label for *_, label in rows]}, schema=schema)


def write_hub(root: Path) -> Path:
    """root/ holding train (bad images among 29 rows, row groups of 7), validation (row groups of 4)
    and test (labels -1)."""
    root.mkdir(parents=True, exist_ok=True)
    rows = fixture_rows()
    pq.write_table(hub_table(rows), root / TRAIN, row_group_size=7)
    good = [r for r in rows if r[0] not in BAD_FILES]
    pq.write_table(hub_table(good[::3]), root / VAL, row_group_size=4)
    pq.write_table(hub_table([(p, b, -1) for p, b, _ in good[1::4]]), root / TEST)
    return root
