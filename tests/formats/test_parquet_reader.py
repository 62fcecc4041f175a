"""Parquet files in the Hugging Face Hub's layout read in place (datapipe.formats.parquet)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

import datapipe.formats.parquet as parquet
from datapipe import make_loader, open_dataset
from datapipe.records import SplitNotFound
from tests.converters.test_parquet import CLASSES, TEST, TRAIN, VAL, hub  # noqa: F401 (hub: the fixture)

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
