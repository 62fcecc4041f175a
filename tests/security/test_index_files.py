"""A DALI `.idx` a dataset brings is read through the one reader of a dataset's files: bounded by its
shard's size (dataset_files.index_limit), so a sparse 300 MB index costs a line, not GBs read whole
and a GB-long error (#38's review: wds_foreign and wds_index read them unbounded)."""
import json
import os
import shutil
import tracemalloc

import pytest

from datapipe import open_dataset
from datapipe.formats.tar import parse_idx

pytestmark = pytest.mark.forked  # tracemalloc in a child with one thread (tests/forked.py)

SPARSE = 300 << 20


def grow_sparse(path, size=SPARSE):
    with open(path, "r+b") as fh:
        fh.truncate(size)


def peak_of(fn):
    tracemalloc.start()
    try:
        with pytest.raises(ValueError) as raised:
            fn()
        return tracemalloc.get_traced_memory()[1], str(raised.value)
    finally:
        tracemalloc.stop()


def test_a_huge_idx_beside_another_tools_shard_is_one_line_without_reading_it(foreign_shards, tmp_path):
    shards = tmp_path / "shards"
    shards.mkdir()
    folder = os.path.dirname(foreign_shards)
    for name in os.listdir(folder):
        (shards / name).write_bytes(open(os.path.join(folder, name), "rb").read())
    first = shards / "foreign-000000.idx"
    first.write_text("v1.2 1\n", encoding="ascii")
    grow_sparse(first)
    pattern = str(shards / "foreign-{000000..000001}.tar")
    peak, message = peak_of(lambda: open_dataset(pattern, cache_dir=tmp_path / "cache"))
    assert "foreign-000000.idx is 314,572,800 bytes, over the" in message and "DALI index" in message
    assert peak < 16 << 20 and len(message) < 400


def test_a_wds_without_an_index_entry_reads_its_shards_idx_bounded(packed_wds, tmp_path):
    copy = tmp_path / packed_wds.name
    shutil.copytree(packed_wds, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["splits"]["train"].pop("index", None)
    (copy / "manifest.json").write_text(json.dumps(manifest))
    idx = sorted(copy.glob("train-*.idx"))[0]
    grow_sparse(idx)
    peak, message = peak_of(lambda: open_dataset(copy))
    assert f"{idx.name} is 314,572,800 bytes, over the" in message and len(message) < 400
    assert peak < 16 << 20


def test_a_long_first_line_of_an_idx_is_shortened_in_the_error():
    with pytest.raises(ValueError) as raised:
        parse_idx("x" * 10_000_000 + "\n", where="s.idx")
    assert len(str(raised.value)) < 300
