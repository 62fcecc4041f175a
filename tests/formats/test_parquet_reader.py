"""Parquet files in the Hugging Face Hub's layout read in place (datapipe.formats.parquet): rows,
splits, row groups; what an open file holds in memory; a bad multi-label id under the loader's on_error."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import datapipe.formats.parquet as parquet
from datapipe import make_loader, open_dataset
from datapipe.records import SplitNotFound
from tests.converters.test_parquet import CLASSES, TEST, TRAIN, VAL, hub  # noqa: F401 (hub: the fixture)
from tests.converters.test_parquet_fields import NAMES, ROWS, table
from tests.parquet_data import IMAGE

pytestmark = pytest.mark.forked  # tracemalloc in a child with one thread (tests/forked.py)

SMALL = dict(backend="dataloader", batch_size=4, image_size=32, device="cpu", train=False, num_workers=0)


def rows_of(file: Path) -> list[tuple[bytes, int]]:
    table = pq.read_table(file)
    return [(img["bytes"], label) for img, label in zip(table["image"].to_pylist(), table["label"].to_pylist())]


@pytest.mark.parametrize("split, name", [("train", TRAIN), ("val", VAL), ("test", TEST)])
def test_each_split_reads_its_rows_in_place_with_the_hub_class_names(hub, split, name):  # noqa: F811
    ds = open_dataset(str(hub / "*.parquet"), split)
    assert ds.classes == CLASSES and not ds.validated
    assert [(s.data, s.label) for s in ds] == rows_of(hub / name)  # bad images too: not validated
    groups = pq.ParquetFile(hub / name).metadata
    assert list(ds.shard_sizes()) == [groups.row_group(g).num_rows for g in range(groups.num_row_groups)]
    assert ds.record(len(ds) - 1).path == f"{hub / name}#row {len(ds) - 1}"


def test_a_row_group_is_read_once_in_order_and_again_only_when_left(hub, monkeypatch):  # noqa: F811
    reads = []
    real = parquet.row_group_images
    monkeypatch.setattr(parquet, "row_group_images", lambda *a: reads.append(a[1]) or real(*a))
    ds = open_dataset(hub / TRAIN)
    [ds[i] for i in range(len(ds))]
    assert reads == list(range(len(ds.shard_sizes())))
    ds[0], ds[len(ds) - 1], ds[0]
    assert reads[-3:] == [0, len(ds.shard_sizes()) - 1, 0]


def test_make_loader_reads_a_split_shard_wise(hub):  # noqa: F811
    loader = make_loader(str(hub / "*.parquet"), split="val", sampling="shards", **SMALL)
    labels = np.concatenate([batch.labels.numpy() for batch in loader])
    assert sorted(labels) == sorted(label for _, label in rows_of(hub / VAL))


def test_a_split_the_files_lack_names_those_they_hold(hub):  # noqa: F811
    with pytest.raises(SplitNotFound, match=r"split 'extra' not in .*\*\.parquet: its files hold test, train, val"):
        open_dataset(str(hub / "*.parquet"), "extra")


N = 200_000  # rows of the memory test's file: a Hub-sized shard, its images one byte each


def big_file(path: Path) -> Path:
    """N rows with an image, a caption and a list of class ids each (no metadata: the ids name the
    classes), in row groups of 1000 rows."""
    ids = pa.ListArray.from_arrays(pa.array(np.arange(N + 1) * 2, pa.int32()), pa.array(np.arange(2 * N) % 977))
    images = pa.StructArray.from_arrays([pa.array([b"x"] * N), pa.array(["x.jpg"] * N)], fields=list(IMAGE))
    table = pa.table({"image": images, "caption": pa.array([f"caption {i}" for i in range(N)]), "labels": ids})
    pq.write_table(table, path, row_group_size=1000)
    return path


def test_a_multi_label_id_beyond_the_class_names_is_a_bad_record_named_and_served_around(tmp_path):
    ids = [[0, 1], [3, 9], [2]] + [[1]] * (len(ROWS) - 3)
    features = {"tags": {"_type": "Sequence", "feature": {"_type": "ClassLabel", "names": NAMES}}}
    pq.write_table(table({"tags": (pa.list_(pa.int64()), ids)}, features), tmp_path / TRAIN, row_group_size=4)
    ds = open_dataset(str(tmp_path / TRAIN))
    bad = f"{tmp_path / TRAIN}#row 1"
    with pytest.raises(ValueError, match=rf"^{re.escape(bad)}: in its multi-label column 'tags', label 9 is not a "
                                         r"class id \(0\.\.3\) \(`datapipe convert` skips such rows\)$") as err:
        ds.record(1)
    assert "\n" not in str(err.value) and ds.record(2).fields.labels == (2,)
    loader = make_loader(str(tmp_path / TRAIN), fields=("image", "multilabel"), max_bad_fraction=0.5,
                         **{**SMALL, "batch_size": len(ROWS)})
    (images, targets, indices), = list(loader)
    assert 1 not in indices.tolist() and targets.shape == (len(ROWS), len(NAMES))
    assert [(b.index, b.path) for b in loader.skipped] == [(1, bad)]
    assert loader.skipped[0].reason == f"ValueError: {err.value}"
