"""A remote `.wds` split opens without fetching its offsets file (8 bytes a record: 16 GB at 2B records):
each shard's sample starts are walked from its own tar headers once the shard is in the cache, and
they are exactly the offsets file's. Real shards from `datapipe convert`, served by moto's S3 server."""
from __future__ import annotations

import hashlib
import json
import pickle
import shutil

import numpy as np
import pytest

from datapipe.formats import open_dataset, wds_index
from datapipe.formats.tar import BLOCK
from tests.shard_tables import edit_shards, shard_entries
from tests.storage.conftest import upload_folder


def cached_names(ds) -> list[str]:
    folder = ds.location.cache.folder
    return sorted(p.name.split("@")[0] for p in folder.iterdir()) if folder.is_dir() else []


def edited_copy(packed_wds, tmp_path, edit) -> tuple:
    """A copy of the fixture .wds whose files and manifest `edit(folder, body)` changed."""
    folder = tmp_path / "edited.wds"
    shutil.copytree(packed_wds, folder)
    body = json.loads((folder / "manifest.json").read_text())
    edit(folder, body)
    (folder / "manifest.json").write_text(json.dumps(body))
    return folder


def test_a_remote_split_opens_fetching_nothing_and_every_span_is_the_offsets_files(s3, packed_wds, tmp_path,
                                                                                 monkeypatch):
    url = s3.bucket("spans") + "/fixture.wds"
    upload_folder(packed_wds, url)
    assert len(open_dataset(packed_wds).shard_entries()) > 1  # spans across shard boundaries are compared
    for split in ("train", "val"):
        local = open_dataset(packed_wds, split)
        held = 2 * max(s["bytes"] for s in local.shard_entries())  # a reader holds 2 shards open, no more
        remote = open_dataset(url, split, cache_dir=tmp_path / split, cache_limit=held)
        remote.location.cache.wait_s = 1.0  # a walk pinning a third shard: CacheFull in a second, not 20 minutes
        assert cached_names(remote) == [] and len(remote) == len(local)
        sent = len(pickle.dumps(remote))
        assert [remote.record(i) for i in range(len(remote))] == [local.record(i) for i in range(len(local))]
        spans = [remote.index.span(i) for i in range(len(remote))]
        assert spans == [local.index.span(i) for i in range(len(local))]
        assert [start for _, start, _ in spans] == np.load(packed_wds / f"{split}.offsets.npy").tolist()
        assert not [n for n in cached_names(remote) if n.endswith(".npy")], "the offsets file was fetched"
        assert len(pickle.dumps(remote)) == sent, "a worker is sent the starts read so far"
    monkeypatch.setattr(wds_index, "STARTS_HELD", 1)  # a process keeps at most this many starts, besides the newest shard's
    ds = open_dataset(url)
    for i in range(len(ds)):
        ds.index.span(i)
    last = ds.index.shard_of(len(ds) - 1)
    assert list(ds.index.shard_starts._held) == [last] and ds.index.shard_starts._count == ds.shard_sizes()[last]


def test_a_remote_split_converted_before_the_offsets_file_opens_without_any_idx(s3, packed_wds, tmp_path):
    def older(folder, body):
        for info in body["splits"].values():
            del info["index"]
        for stale in [*folder.glob("*.offsets.npy"), *folder.glob("*.idx")]:
            stale.unlink()  # not in the store: a reader that needs one fails

    url = s3.bucket("older") + "/fixture.wds"
    upload_folder(edited_copy(packed_wds, tmp_path, older), url)
    remote, local = open_dataset(url), open_dataset(packed_wds)
    assert [remote.record(i) for i in range(len(remote))] == [local.record(i) for i in range(len(local))]


def shift_one_sample(by: int):
    def shift(shards):
        shards[0]["samples"] += by
        shards[1]["samples"] -= by

    def edit(folder, body):
        """Shard 0 listed with `by` samples more, shard 1 with `by` fewer: the total still matches."""
        edit_shards(folder, body, shift)
    return edit


def zero_a_header(folder, body):
    """The second sample's first header zeroed in shard 0 (an early end of archive), its sha256 updated."""
    path = folder / shard_entries(folder)[0]["name"]
    blob = bytearray(path.read_bytes())
    second = int(np.load(folder / "train.offsets.npy")[1])
    blob[second:second + BLOCK] = bytes(BLOCK)
    edit_shards(folder, body, lambda shards: shards[0].update(sha256=hashlib.sha256(blob).hexdigest()))
    path.write_bytes(bytes(blob))


@pytest.mark.parametrize("edit, error", [
    (shift_one_sample(-1), r"its tar headers hold more than the \d+ samples the manifest lists; the shard is damaged"),
    (shift_one_sample(1), r"its tar headers hold (\d+) samples in (\d+) bytes, the manifest (?!\1 )\d+ in \2; "),
    (zero_a_header, r"no regular USTAR member header where a sample's member should be at byte \d+; the shard"),
], ids=["fewer-listed", "more-listed", "header"])
def test_a_shard_whose_headers_disagree_with_the_manifest_is_refused_in_one_line(s3, packed_wds, tmp_path, edit,
                                                                                 error):
    url = s3.bucket("crafted") + "/fixture.wds"
    upload_folder(edited_copy(packed_wds, tmp_path, edit), url)
    ds = open_dataset(url)
    with pytest.raises(ValueError, match=rf"^{url}/train-000000\.tar: {error}") as caught:
        [ds.record(i) for i in range(ds.shard_entries().first(1) + 1)]
    assert "\n" not in str(caught.value)
