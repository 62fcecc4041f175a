"""A cache that checks what it serves and belongs to its user (issue #34, finding 4): a cached copy
changed on the disk is fetched again, never served; a cache folder that another user owns or could
change (a folder given away, a world-writable one, a symbolic link planted at the default path, a
parent anyone may write to) is refused in one line, with what it held never read. These tests run as
root, which can give a folder to another uid (OTHER) to play that other user."""
from __future__ import annotations

import hashlib
import logging
import os
import pickle
import re
import stat

import numpy as np
import pytest

from datapipe import open_dataset
from datapipe.cli.main import main
from datapipe.formats import wds_foreign
from datapipe.storage import RemoteStore, ShardCache, verify
from datapipe.storage.cachedir import UnsafeCacheDir, default_cache_dir, own_folder
from tests.storage.conftest import upload_folder

OTHER = 12345  # a uid that is not ours


@pytest.fixture
def s3_wds(s3, packed_wds):
    url = s3.bucket("trust") + "/fixture.wds"
    upload_folder(packed_wds, url)
    return url


def flip_inside(path, data: bytes) -> None:
    """Change one byte in the middle of `data` where it lies in `path`: in place, same size, same file."""
    blob = path.read_bytes()
    at = blob.index(data) + len(data) // 2
    with open(path, "r+b") as fh:
        fh.seek(at)
        fh.write(bytes([blob[at] ^ 0xFF]))


def give_away(*paths) -> None:
    for path in paths:
        os.chown(path, OTHER, OTHER, follow_symlinks=False)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_flipped_bytes_in_a_cached_shard_are_fetched_again_never_served(s3_wds, caplog):
    first = open_dataset(s3_wds)
    image = first.record(0).data  # shard 0 is now cached, and `first` holds it open
    entry = first.shard_entries()[0]
    copy = first.location.cache.path(entry["name"], sha256=entry["sha256"])
    flip_inside(copy, image)
    again = open_dataset(s3_wds)
    with caplog.at_level(logging.WARNING):
        assert again.record(0).data == image
    assert f"cached {copy} differs from the manifest's sha256" in caplog.text and "fetching it again" in caplog.text
    assert hashlib.sha256(copy.read_bytes()).hexdigest() == entry["sha256"]  # a whole copy in its place
    assert first.record(1).key == again.record(1).key  # the reader that held the damaged copy is undisturbed
    assert first.location.cache.lock_path(entry["name"]).exists()


def test_a_changed_cached_shard_header_is_never_walked(s3_wds, packed_wds):
    first = open_dataset(s3_wds)
    records = [first.record(i) for i in range(len(first))]  # every shard cached, its sample starts walked
    entry = first.shard_entries()[0]
    copy = first.location.cache.path(entry["name"], sha256=entry["sha256"])
    flip_inside(copy, first.record(1).key.encode())  # in its first header's name: a walk would see another sample
    again = open_dataset(s3_wds)  # reads the cached copies; a walk of the changed one would misplace record 1
    assert [again.record(i) for i in range(len(first))] == records


def test_each_process_hashes_a_cached_copy_once(s3_wds, tmp_path, monkeypatch):
    entry = open_dataset(s3_wds).shard_entries()[0]
    hashed = []
    real = verify.sha256_fd
    monkeypatch.setattr(verify, "sha256_fd", lambda fd: hashed.append(fd) or real(fd))

    def opens(cache: ShardCache, times: int) -> int:
        before = len(hashed)
        for _ in range(times):
            os.close(cache.open(entry["name"], size=entry["bytes"], sha256=entry["sha256"]))
        return len(hashed) - before

    downloader = ShardCache(RemoteStore(s3_wds), tmp_path / "c")
    assert opens(downloader, 3) == 1  # the download's own check, then none
    reader = ShardCache(RemoteStore(s3_wds), tmp_path / "c")
    assert opens(reader, 3) == 1  # another reader: once, on its first open
    assert opens(pickle.loads(pickle.dumps(reader)), 2) == 1  # a worker it is sent to starts afresh


def test_a_default_cache_folder_another_user_made_is_refused_with_the_index_planted_in_it(
        foreign_shards, tmp_path, monkeypatch):
    """The finding: another user made $TMPDIR/datapipe-UID first and planted the index of these shards
    (found by their paths, sizes and times) with every label 0."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    shards = wds_foreign.expand_shards(foreign_shards)
    index = wds_foreign.cached_index(foreign_shards, shards, tmp_path / "scratch")  # where it would be cached
    [name] = [p.name for p in (tmp_path / "scratch" / "index").glob("*.npz")]
    planted = tmp_path / f"datapipe-{os.getuid()}" / "index" / name
    planted.parent.mkdir(parents=True)
    np.savez(planted, **{**index, "label": np.zeros_like(index["label"])})
    give_away(planted, planted.parent, planted.parent.parent)
    mine = re.escape(str(planted.parent.parent))
    with pytest.raises(UnsafeCacheDir, match=rf"the cache folder {mine} belongs to uid {OTHER}, not to you "
                                             r"\(uid \d+.*\): .* give cache_dir= \(--cache-dir\) a folder of yours"):
        open_dataset(foreign_shards)


def test_a_cache_folder_others_can_write_to_is_refused(clean_folder, foreign_shards, tmp_path, monkeypatch):
    given = tmp_path / "given"
    given.mkdir()
    os.chmod(given, 0o777)
    with pytest.raises(UnsafeCacheDir, match=r"the cache folder .*given is writable by group or others \(mode 0777\): "
                                             r"they could plant the files it serves; chmod 700 .*given"):
        open_dataset(clean_folder, cache_dir=given)
    with pytest.raises(UnsafeCacheDir, match="given is writable by group or others"):
        ShardCache(RemoteStore("s3://bucket/data.wds"), given)
    with pytest.raises(UnsafeCacheDir, match="given is writable by group or others"):  # a shard pattern's index
        open_dataset(foreign_shards, cache_dir=given)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    default = tmp_path / f"datapipe-{os.getuid()}"
    default.mkdir(mode=0o770)
    os.chmod(default, 0o770)
    with pytest.raises(UnsafeCacheDir, match=r"writable by group or others \(mode 0770\).*or point TMPDIR at one"):
        open_dataset(clean_folder)


def test_a_symbolic_link_at_the_default_path_is_refused_unless_it_is_ours_to_a_folder_of_ours(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    link, theirs, mine = tmp_path / f"datapipe-{os.getuid()}", tmp_path / "theirs", tmp_path / "mine"
    theirs.mkdir(mode=0o700)
    mine.mkdir(mode=0o700)
    link.symlink_to(mine)
    give_away(link, theirs)  # their link, to a folder of ours
    with pytest.raises(UnsafeCacheDir, match=rf"{re.escape(str(link))} is a symbolic link made by uid {OTHER}, not "):
        default_cache_dir()
    link.unlink()
    link.symlink_to(theirs)  # our link, to their folder
    with pytest.raises(UnsafeCacheDir, match=rf"{re.escape(str(link))} belongs to uid {OTHER}"):
        default_cache_dir()
    link.unlink()
    link.symlink_to(mine)  # ours to ours: a cache moved to a bigger disk
    assert default_cache_dir() == link and ShardCache(RemoteStore("s3://bucket/data.wds")).root == link / "shards"


def test_a_cache_folder_inside_a_folder_others_can_write_to_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)  # anyone may rename the cache folder away and put theirs there
    where = re.escape(str(shared))
    with pytest.raises(UnsafeCacheDir, match=rf"the cache folder {where}/cache is inside {where}, which others may "
                                             r"write to \(mode 0777, no sticky bit\)"):
        own_folder(shared / "cache")
    os.chmod(shared, 0o1777)  # as /tmp: the sticky bit keeps them off entries they do not own
    assert mode(own_folder(shared / "cache")) == 0o700


def test_cache_folders_are_made_0700_and_an_old_default_one_is_tightened(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    assert mode(default_cache_dir()) == 0o700
    os.chmod(default_cache_dir(), 0o755)  # as an older datapipe made it: others could read the cached data
    assert mode(default_cache_dir()) == 0o700
    assert mode(ShardCache(RemoteStore("s3://bucket/data.wds"), tmp_path / "new" / "cache").root) == 0o700


def test_the_cli_refuses_a_cache_folder_of_another_user_in_one_line(s3_wds, tmp_path, capsys):
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    give_away(theirs)
    assert main(["bench", s3_wds, "--cache-dir", str(theirs), "--suites", "read"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{theirs} belongs to uid {OTHER}" in err and "--cache-dir" in err
