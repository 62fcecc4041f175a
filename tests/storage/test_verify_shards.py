"""A local `.wds` dataset's shard files against the sizes and sha256s its shard table (or a version 2
manifest's list) gives, naming the shards that differ (`ShardList.verify_files`, what `datapipe verify`
checks besides the records; issue #47, row 2): the records alone passed a table whose sha256 for a shard
was wrong, and the remote cache then refused the shard."""
from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from datapipe import cli
from datapipe.formats import open_dataset
from datapipe.formats.inspect import verify
from tests.shard_tables import edit_shards, list_shards

WRONG = "0f" * 32


def copied(packed_wds: Path, tmp_path: Path, *, listed: bool = False) -> tuple[Path, dict]:
    folder = tmp_path / "copy.wds"
    shutil.copytree(packed_wds, folder)
    body = json.loads((folder / "manifest.json").read_text())
    if listed:  # as the datapipe before the shard table wrote it (manifest version 2)
        list_shards(folder, body)
    return folder, body


def wrong_sha256(folder: Path, body: dict, number: int, *, listed: bool = False) -> str:
    """Shard `number`'s sha256 in the table (or the list) made wrong; its name."""
    if listed:
        entry = body["splits"]["train"]["shards"][number]
        entry["sha256"] = WRONG
    else:
        edit_shards(folder, body, lambda shards: shards[number].update(sha256=WRONG))
    (folder / "manifest.json").write_text(json.dumps(body))
    return f"train-{number:06d}.tar"


@pytest.mark.parametrize("listed", [False, True], ids=["table", "listed"])
def test_a_shard_whose_sha256_is_not_the_one_the_table_gives_is_named(packed_wds, tmp_path, listed):
    folder, body = copied(packed_wds, tmp_path, listed=listed)
    name = wrong_sha256(folder, body, 1, listed=listed)
    source = "the manifest" if listed else "the shard table"
    shards = open_dataset(folder).shard_entries()
    with pytest.raises(ValueError, match=rf"^{re.escape(str(folder))}: 1 of {len(shards)} shards differ from {source}: "
                                         rf"{name}: another sha256; the shards or {source} changed since the conversion: "
                                         r"re-convert the dataset$"):
        shards.verify_files()


def test_missing_cut_and_wrong_shards_are_named_the_first_three_then_counted(packed_wds, tmp_path):
    folder, body = copied(packed_wds, tmp_path)
    shards = sorted(folder.glob("train-*.tar"))
    assert len(shards) >= 4
    for number in (2, 3):
        wrong_sha256(folder, body, number)
    shards[0].unlink()
    shards[1].write_bytes(shards[1].read_bytes()[:-512])
    size = shards[1].stat().st_size
    with pytest.raises(ValueError) as caught:
        open_dataset(folder).shard_entries().verify_files()
    assert "\n" not in str(caught.value)
    assert (f": 4 of {len(shards)} shards differ from the shard table: train-000000.tar: missing; train-000001.tar: "
            f"{size:,} bytes, not {size + 512:,}; train-000002.tar: another sha256; and 1 more; ") in str(caught.value)


def test_the_shard_check_refuses_a_shard_that_is_not_a_regular_file_without_reading_it(packed_wds, tmp_path):
    folder, _ = copied(packed_wds, tmp_path)
    shard = folder / "train-000000.tar"
    shard.unlink()
    os.mkfifo(shard)  # an open for reading would block for good
    with pytest.raises(ValueError, match=r"shards differ from the shard table: train-000000\.tar: a FIFO; "):
        open_dataset(folder).shard_entries().verify_files()


def test_an_intact_dataset_passes_and_a_remote_ones_shards_are_left_to_its_cache(packed_wds, s3_wds, tmp_path):
    open_dataset(packed_wds).shard_entries().verify_files()
    open_dataset(s3_wds, cache_dir=tmp_path / "cache").shard_entries().verify_files()  # the table only: nothing fetched
    assert not list((tmp_path / "cache").rglob("*.tar"))


@pytest.mark.parametrize("listed", [False, True], ids=["table", "listed"])
def test_verify_says_damaged_naming_the_shard_after_the_records(packed_wds, tmp_path, capsys, listed):
    folder, body = copied(packed_wds, tmp_path, listed=listed)
    name = wrong_sha256(folder, body, 1, listed=listed)
    source = "the manifest" if listed else "the shard table"
    expected = (f"split 'train': {folder}: 1 of {len(open_dataset(folder).shard_entries())} shards differ from {source}: "
                f"{name}: another sha256; the shards or {source} changed since the conversion: re-convert the dataset")
    assert verify(folder, progress=False).problems == [expected]  # it said OK: the records are intact
    assert cli.main(["verify", str(folder)]) == 1
    assert capsys.readouterr().out == f"{folder}: DAMAGED, 1 problem(s); first: {expected}\n"
