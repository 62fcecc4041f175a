"""A dataset from a stranger cannot make datapipe create, touch or read files outside the dataset and
its cache: every name it supplies is checked (datapipe.names), cache files are named safely."""
from __future__ import annotations

import io
import json
import os
import shutil
import tarfile

import pytest

from datapipe import open_dataset
from datapipe.names import UnsafeName, check_name
from datapipe.storage import RemoteStore, ShardCache, StoreError

from tests.security.conftest import isolated_cache, upload_folder
from tests.shard_tables import list_shards

OLD = 1_000_000_000  # an mtime (seconds) no test run has


def crafted(packed_wds, tmp_path, edit) -> tuple:
    """A copy of the fixture .wds whose manifest `edit(body)` changed; (folder, its offsets entry)."""
    folder = tmp_path / "ds.wds"
    shutil.copytree(packed_wds, folder)
    body = json.loads((folder / "manifest.json").read_text())
    index = dict(body["splits"]["train"]["index"])
    if getattr(edit, "listed", False):  # a dataset from before the shard table: its manifest names each shard
        list_shards(folder, body)
    edit(body)
    (folder / "manifest.json").write_text(json.dumps(body))
    return folder, index


def climbing(target) -> str:
    return "../" * 24 + str(target).lstrip("/")


def attempt(fn) -> Exception | None:
    """What `fn()` raised, None if it returned (the filesystem is checked before the error)."""
    try:
        fn()
    except Exception as exc:
        return exc
    return None


def created_outside(tmp_path, allowed=("ds.wds", "cache", "tmpdir")) -> list[str]:
    return sorted(p.name for p in tmp_path.iterdir() if p.name not in allowed)


def set_index_name(name):
    def edit(body):
        body["splits"]["train"]["index"]["name"] = name
    return edit


def test_a_remote_index_name_climbing_out_creates_nothing_outside_the_cache(s3, packed_wds, tmp_path):
    folder, _ = crafted(packed_wds, tmp_path, set_index_name(climbing(tmp_path / "x" / "pwned")))
    url = s3.bucket("data") + "/crafted.wds"
    upload_folder(folder, url)
    error = attempt(lambda: open_dataset(url, cache_dir=tmp_path / "cache"))
    assert created_outside(tmp_path) == [], "a lock or folder was created outside the cache"
    assert isinstance(error, UnsafeName), error
    assert "splits['train'].index.name" in str(error) and "climbs out" in str(error)


def test_a_remote_absolute_index_name_neither_serves_nor_touches_that_file(s3, packed_wds, tmp_path):
    victim = tmp_path / "victim"
    folder, index = crafted(packed_wds, tmp_path, set_index_name(str(victim / "pwned")))
    victim.mkdir()
    copy = victim / f"pwned@{index['sha256'][:16]}"  # what the old cache took for its cached copy
    shutil.copy(folder / index["name"], copy)
    os.utime(copy, (OLD, OLD))
    url = s3.bucket("data") + "/crafted.wds"
    upload_folder(folder, url)
    error = attempt(lambda: open_dataset(url, cache_dir=tmp_path / "cache"))
    assert os.stat(copy).st_mtime == OLD, "a file outside the cache was touched as a cached copy"
    assert isinstance(error, UnsafeName) and "is absolute" in str(error)
    assert created_outside(tmp_path, ("ds.wds", "cache", "tmpdir", "victim")) == []


def test_the_cache_names_its_files_safely_whatever_name_it_is_given(s3, tmp_path):
    cache = ShardCache(RemoteStore(s3.bucket("data") + "/x.wds"), tmp_path / "cache")
    with pytest.raises(StoreError):
        os.close(cache.open(climbing(tmp_path / "x" / "pwned"), size=3))
    assert created_outside(tmp_path) == [], "the cache created a file outside its folder"
    for name in ("/etc/passwd", "../../a", "a/b", "a~b~1", "é"):
        assert cache.path(name, size=3).parent == cache.folder
        assert cache.path(name, sha256="../../../../x" * 6).parent == cache.folder


def edit_entry(split, field, value):
    def edit(body):
        info = body["splits"][split]
        entry = info["shards"][0] if edit.listed else info[field.split(".")[0]]
        entry[field.split(".")[-1]] = value
    edit.listed = field.startswith("shards.")
    return edit


def rename_split(body):
    body["splits"]["../../evil"] = body["splits"].pop("val")


@pytest.mark.parametrize("edit, field, outside", [
    (edit_entry("train", "index.name", "../outside/offsets.npy"), r"splits\['train'\]\.index\.name", True),
    (edit_entry("train", "index.name", "OUTSIDE/offsets.npy"), r"splits\['train'\]\.index\.name", True),
    (edit_entry("train", "shards.name", "../outside/shard.tar"), r"splits\['train'\]\.shards\[0\]\.name", True),
    (edit_entry("train", "shards.name", "OUTSIDE/shard.tar"), r"splits\['train'\]\.shards\[0\]\.name", True),
    (edit_entry("train", "shards.name", "a\\b.tar"), "backslash", False),
    (edit_entry("train", "shards.name", "a\x00.tar"), "NUL or control", False),
    (edit_entry("train", "shards.name", "x" * 300), "longer than", False),
    (edit_entry("train", "shards.sha256", "../../../x"), r"shards\[0\]\.sha256", False),
    (edit_entry("train", "shards.bytes", "../x"), r"shards\[0\]\.bytes", False),
    (rename_split, "split name", False),
    (edit_entry("train", "table.name", "../outside/train.shards.bin"), r"splits\['train'\]\.table\.name", True),
    (edit_entry("train", "table.name", "OUTSIDE/train.shards.bin"), r"splits\['train'\]\.table\.name", True),
    (edit_entry("train", "table.head_sha256", "../../../x"), r"table\.head_sha256", False),
    (edit_entry("train", "table.shards", -1), r"table\.shards", False),
], ids=["index-up", "index-absolute", "shard-up", "shard-absolute", "backslash", "nul", "long", "digest", "size",
        "split", "table-up", "table-absolute", "table-digest", "table-count"])
def test_a_local_manifest_names_nothing_outside_the_dataset(packed_wds, tmp_path, edit, field, outside):
    outside_dir = tmp_path / "outside"
    shutil.copytree(packed_wds, outside_dir)  # what a crafted name points at: readable data, as an attacker would
    (outside_dir / "offsets.npy").write_bytes((packed_wds / "train.offsets.npy").read_bytes())
    shutil.copy(packed_wds / "train-000000.tar", outside_dir / "shard.tar")

    def absolute(body):
        edit(body)
        text = json.dumps(body).replace("OUTSIDE", str(outside_dir))
        body.clear()
        body.update(json.loads(text))

    absolute.listed = getattr(edit, "listed", False)
    folder, _ = crafted(packed_wds, tmp_path, absolute)
    with pytest.raises(ValueError, match=field):
        ds = open_dataset(folder, "train")
        [ds.record(i) for i in range(len(ds))]  # the old code read the records from outside


def test_the_error_is_one_line_naming_the_field(packed_wds, tmp_path):
    folder, _ = crafted(packed_wds, tmp_path, set_index_name("../x\n" + "y" * 2000))
    with pytest.raises(UnsafeName) as caught:
        open_dataset(folder)
    message = str(caught.value)
    assert "\n" not in message and len(message) < 400 and "manifest.json: splits['train'].index.name" in message


@pytest.mark.parametrize("stem", ["../../evil", "/tmp/evil", "a\\evil", "a\x01evil"])
def test_a_foreign_tar_member_name_outside_the_rule_never_becomes_a_key(tmp_path, monkeypatch, stem):
    isolated_cache(monkeypatch, tmp_path)
    shard = tmp_path / "foreign-000000.tar"
    with tarfile.open(shard, "w", format=tarfile.USTAR_FORMAT) as tar:
        for ext, data in (("cls", b"0"), ("jpg", b"\xff\xd8\xff\xe0 not really")):
            info = tarfile.TarInfo(f"{stem}.{ext}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    try:
        ds = open_dataset(str(shard))
        keys = [ds.record(i).key for i in range(len(ds))]  # skipped by the tar parser, or refused here
    except UnsafeName:
        keys = []
    assert keys == []


@pytest.mark.parametrize("name", ["train-000000.tar", "sub/dir/a.b.tar", "n01440764_10026", "é.tar"])
def test_plain_names_pass(name):
    assert check_name(name, "f") == name


@pytest.mark.parametrize("name", ["", ".", "a/./b", "a//b", "/a", "..", "a/../b", "a\\b", "a\tb", "a\x7f", 5,
                                  "x" * 1025])
def test_other_names_fail(name):
    with pytest.raises(UnsafeName, match="^field "):
        check_name(name, "field")
