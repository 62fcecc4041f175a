"""Datasets in object storage (moto's S3 server and a Range-capable HTTP server on 127.0.0.1): the
same records as on disk, shard-wise loading with resume, the shard cache, and clear failures."""
from __future__ import annotations

import logging
import os
import shutil

import pytest

from datapipe import make_loader, open_dataset
from datapipe.storage import RetryPolicy, StoreNotFound, StoreUnavailable

from tests.storage.conftest import upload_folder

SMALL = dict(batch_size=4, image_size=32, device="cpu", num_workers=2)
FAIL_FAST = RetryPolicy(max_retries=2, first_backoff_s=0.01, max_backoff_s=0.05, budget_s=5)


@pytest.fixture
def s3_wds(s3, packed_wds):
    url = s3.bucket("data") + "/fixture.wds"
    upload_folder(packed_wds, url)
    return url


def read_all(ds):
    return [ds.record(i) for i in range(len(ds))]


def cached_files(ds):
    """The names of the whole copies in the dataset's cache folder (NAME@KEY)."""
    return sorted(p.name.split("@")[0] for p in ds.location.cache.folder.iterdir() if not p.name.startswith("."))


def cached_copy(ds, name):
    (path,) = ds.location.cache.folder.glob(f"{name}@*")
    return path


def fetch(cache, name):
    os.close(cache.open(name))


def test_an_s3_dataset_reads_the_same_records_as_on_disk_through_the_cache(s3_wds, packed_wds):
    for split in ("train", "val"):
        remote, local = open_dataset(s3_wds, split), open_dataset(packed_wds, split)
        assert remote.classes == local.classes and read_all(remote) == read_all(local)
    names = cached_files(remote)
    assert "val-000000.tar" in names and not [n for n in names if n.endswith(".part")]


def test_an_https_style_source_reads_the_same_records(http_root, packed_wds):
    root, base = http_root
    shutil.copytree(packed_wds, root / "fixture.wds")
    remote = open_dataset(f"{base}/fixture.wds")
    assert read_all(remote) == read_all(open_dataset(packed_wds))


@pytest.mark.parametrize("backend", ["dataloader", "dali"])
def test_loading_from_s3_is_shard_wise_every_sample_once_equal_ranks_right_labels(s3_wds, packed_wds, backend):
    if backend == "dali":
        pytest.importorskip("nvidia.dali")
    labels = [r.label for r in read_all(open_dataset(packed_wds))]
    loaders = [make_loader(s3_wds, backend=backend, rank=r, world_size=2, **SMALL) for r in range(2)]
    assert type(loaders[0].order).__name__ == "ShardOrder"
    seen = []
    for loader in loaders:
        loader.set_epoch(0)
        batches = [(i.tolist(), l.tolist()) for _, l, i in loader]
        assert len(batches) == len(loader)
        seen += [i for idx, _ in batches for i in idx]
        assert all(labels[i] == lab for idx, labs in batches for i, lab in zip(idx, labs))
    assert set(seen) == set(range(len(labels))) and len(seen) - len(labels) < 2


def test_resume_over_s3_exact_and_elastic(s3_wds):
    full = make_loader(s3_wds, backend="dataloader", rank=0, world_size=2, **SMALL)
    full.set_epoch(1)
    unbroken = [i for _, _, idx in full for i in idx.tolist()]
    states, seen = [], []
    for r in range(2):
        loader = make_loader(s3_wds, backend="dataloader", rank=r, world_size=2, **SMALL)
        loader.set_epoch(1)
        for n, (_, _, idx) in enumerate(loader):
            seen += idx.tolist()
            if n == 1:
                states.append(loader.state_dict())
                break
    again = make_loader(s3_wds, backend="dataloader", rank=0, world_size=2, **SMALL)
    again.load_state_dict(states[0])
    again.set_epoch(1)
    assert [i for _, _, idx in again for i in idx.tolist()] == unbroken[8:]  # exact at the same world size
    rest = []
    for r in range(3):
        loader = make_loader(s3_wds, backend="dataloader", rank=r, world_size=3, **SMALL)
        loader.load_state_dict(states[0])
        loader.set_epoch(1)
        rest += [i for _, _, idx in loader for i in idx.tolist()]
    size = len(open_dataset(s3_wds))
    assert set(seen) | set(rest) == set(range(size)) and len(seen) + len(rest) - size < 3


def test_a_full_cache_serves_epoch_two_after_the_server_is_gone(s3, s3_wds):
    loader = make_loader(s3_wds, backend="dataloader", **SMALL)
    loader.set_epoch(0)
    first = sorted(i for _, _, idx in loader for i in idx.tolist())
    s3.stop()
    loader.set_epoch(1)
    assert sorted(i for _, _, idx in loader for i in idx.tolist()) == first


def test_a_server_gone_mid_epoch_ends_in_an_error_naming_the_shard(s3, s3_wds, caplog):
    loader = make_loader(s3_wds, backend="dataloader", **{**SMALL, "num_workers": 0})
    loader.dataset.location.store.retry = FAIL_FAST  # refused at once: not the default's ~12 s of backoff
    loader.set_epoch(0)
    batches = iter(loader)
    next(batches)
    s3.stop()
    loader.dataset.location.cache.drain()  # read-ahead downloads in flight end first
    for shard in loader.dataset.location.cache.folder.glob("*.tar@*"):  # what a small cache evicted
        shard.unlink()
    with caplog.at_level(logging.DEBUG), pytest.raises(StoreUnavailable, match=r"s3://data/fixture\.wds/train-0000\d\d\.tar"):
        for _ in batches:
            pass
    assert "testing-secret-never-printed" not in caplog.text


def test_a_missing_dataset_or_object_is_named_at_once(s3):
    bucket = s3.bucket("empty")
    with pytest.raises(StoreNotFound, match="s3://empty/none.wds/manifest.json does not exist.*not a datapipe dataset"):
        open_dataset(f"{bucket}/none.wds")


@pytest.mark.parametrize("name", ["imagenet.h5", "imagenet.hdf5", "imagenet.lmdb"])
def test_a_packed_file_uploaded_whole_is_refused_as_a_format_that_does_not_stream(s3, packed_hdf5, name):
    """An HDF5 (or LMDB) file copied to a bucket has no manifest beside it: the answer is that only
    .wds streams, not advice to finish a conversion that never ran."""
    from datapipe.storage import RemoteStore

    url = s3.bucket("files") + "/" + name
    RemoteStore(s3.bucket("files")).upload(name, packed_hdf5.read_bytes())
    with pytest.raises(ValueError, match=rf"s3://files/{name} is named as a (hdf5|lmdb) dataset: only .wds datasets "
                                         "stream from object storage") as caught:
        make_loader(url, **SMALL)
    assert "--resume" not in str(caught.value) and "\n" not in str(caught.value)


def test_a_cached_shard_of_the_wrong_size_is_fetched_again_and_a_damaged_upload_refused(s3_wds, packed_wds):
    ds = open_dataset(s3_wds)
    expected = read_all(ds)
    shard = cached_copy(ds, "train-000000.tar")
    shard.write_bytes(shard.read_bytes()[:1000])
    assert read_all(open_dataset(s3_wds)) == expected
    assert shard.stat().st_size == (packed_wds / "train-000000.tar").stat().st_size

    from datapipe.storage import RemoteStore

    blob = bytearray((packed_wds / "train-000001.tar").read_bytes())
    blob[700] ^= 0xFF  # same size, other bytes: only the checksum can tell
    RemoteStore(s3_wds).upload("train-000001.tar", bytes(blob))
    shutil.rmtree(ds.location.cache.folder)
    fresh = open_dataset(s3_wds)
    first = fresh.shard_entries().first(1)
    with pytest.raises(OSError, match="train-000001.tar: its sha256 differs from the manifest"):
        fresh.record(first)


def test_a_cache_limit_smaller_than_the_shards_in_flight_is_refused(s3_wds):
    with pytest.raises(ValueError, match=r"cache_limit=1,000 bytes is too small.*need [\d,]+ bytes"):
        make_loader(s3_wds, cache_limit=1000, **SMALL)


def test_the_cache_evicts_least_recently_used_and_stays_under_its_limit(s3_wds, tmp_path):
    probe = open_dataset(s3_wds, cache_dir=tmp_path / "c")
    sizes = [s["bytes"] for s in probe.shard_entries()]
    assert len(sizes) >= 3
    limit = max(sizes) * 2  # a remote split's offsets come from its shards: no offsets file in the cache
    ds = open_dataset(s3_wds, cache_dir=tmp_path / "c", cache_limit=limit)
    cache = ds.location.cache
    for name in ("train-000000.tar", "train-000001.tar"):
        fetch(cache, name)
    fetch(cache, "train-000000.tar")  # used again: now the most recent
    fetch(cache, "train-000002.tar")
    names = cached_files(ds)
    assert "train-000000.tar" in names and "train-000002.tar" in names and "train-000001.tar" not in names
    assert sum(p.stat().st_size for p in cache.root.glob("*/*")) <= limit
    assert read_all(ds) == read_all(open_dataset(s3_wds))  # evicted shards come back when needed


def test_a_crashed_download_leaves_nothing_that_looks_whole(s3_wds, tmp_path):
    ds = open_dataset(s3_wds, cache_dir=tmp_path / "c", cache_limit=10 << 20)
    cache = ds.location.cache
    copy = cache.path("train-000000.tar", sha256=ds.shard_entries()[0]["sha256"])
    stale = cache.folder / f".{copy.name}~{cache.host}~999999999.part"  # a download whose process died
    cache.folder.mkdir(parents=True, exist_ok=True)  # the open fetched nothing: the folder comes with a download
    stale.write_bytes(b"half a shard")
    assert not copy.exists()
    fetch(cache, "train-000001.tar")  # making room sweeps parts of dead processes
    assert not stale.exists()
    assert ds.record(0) == open_dataset(s3_wds).record(0)


def test_credentials_from_the_aws_files_when_the_environment_has_none(s3, s3_wds, packed_wds, tmp_path, monkeypatch):
    home = tmp_path / "home"
    (home / ".aws").mkdir(parents=True)
    (home / ".aws" / "credentials").write_text("[team]\naws_access_key_id = fromfile\naws_secret_access_key = filesecret\n")
    (home / ".aws" / "config").write_text("[profile team]\nregion = us-east-1\n")
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(var)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("AWS_PROFILE", "team")
    from datapipe.storage.urls import _aws_files_config

    assert _aws_files_config(dict(os.environ)) == {"aws_access_key_id": "fromfile", "aws_secret_access_key": "filesecret",
                                                   "region": "us-east-1"}
    assert open_dataset(s3_wds).record(0) == open_dataset(packed_wds).record(0)


def test_refused_credentials_fail_at_once_naming_what_to_check(s3, s3_wds, monkeypatch):
    from moto import settings

    from datapipe.storage import StoreAccessDenied

    monkeypatch.setattr(settings, "INITIAL_NO_AUTH_ACTION_COUNT", 0)  # the server now checks keys
    with pytest.raises(StoreAccessDenied, match=r"s3://data/fixture\.wds/manifest\.json: access denied; check the credentials") as caught:
        open_dataset(s3_wds)
    assert "testing-secret-never-printed" not in str(caught.value)


def test_training_reads_an_s3_dataset(s3_wds, tmp_path):
    from datapipe.train import TrainConfig, train

    metrics = train(TrainConfig(data=s3_wds, out=str(tmp_path / "run"), model="resnet18", epochs=1, batch_size=8,
                                image_size=32, workers=1, backend="dataloader", warmup_epochs=0, log_every=2))
    assert metrics[0]["epoch"] == 0 and metrics[0]["val_acc"] is not None


def test_local_shards_on_request_resume_elastically_in_dali(packed_wds):
    pytest.importorskip("nvidia.dali")
    size = len(open_dataset(packed_wds))
    options = dict(SMALL, backend="dali", sampling="shards")
    first = [make_loader(packed_wds, rank=r, world_size=3, **options) for r in range(3)]
    seen, state = [], None
    for loader in first:
        loader.set_epoch(2)
        batches = iter(loader)
        seen += next(batches)[2].tolist()
        state = loader.state_dict()
    rest = []
    for r in range(2):
        loader = make_loader(packed_wds, rank=r, world_size=2, **options)
        loader.load_state_dict(state)
        loader.set_epoch(2)
        rest += [i for _, _, idx in loader for i in idx.tolist()]
    assert set(seen) | set(rest) == set(range(size)) and len(seen) + len(rest) - size < 2


def test_global_sampling_over_a_store_needs_a_cache_for_every_shard(s3_wds):
    with pytest.raises(ValueError, match="sampling='global' reads from every shard"):
        make_loader(s3_wds, sampling="global", cache_limit=200_000, **SMALL)
    loader = make_loader(s3_wds, sampling="global", **SMALL)
    assert type(loader.order).__name__ == "EpochOrder"
