"""`datapipe convert SRC s3://...`: the same bytes as a local conversion, the manifest last, kill and
--resume, and the refusals a local destination gets."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from converters import ConvertError, ConvertOptions, convert
from datapipe import open_dataset
from datapipe.storage import RemoteStore, StoreNotFound

from tests.converters.stopping import after_shards, kill_convert_when_stopped
from tests.converters.test_resume import big_source  # noqa: F401  (a fixture: 900 images and two bad files)

OPTIONS = ConvertOptions(workers=2, progress=False, shard_bytes=64 << 10)


def same_bytes_as_local(url: str, local: Path) -> None:
    store = RemoteStore(url)
    objects = store.list()
    files = {p.name for p in local.iterdir()}
    assert set(objects) == files
    for name in files - {"manifest.json"}:
        assert store.read(name) == (local / name).read_bytes(), name
    remote, here = json.loads(store.read("manifest.json")), json.loads((local / "manifest.json").read_text())
    for volatile in ("created", "seconds", "arguments"):
        remote.pop(volatile), here.pop(volatile)
    assert remote == here


def test_converting_to_s3_writes_what_a_local_conversion_writes(s3, imagefolder, tmp_path):
    url = s3.bucket("out") + "/fixture.wds"
    report = convert(imagefolder, url, OPTIONS)
    assert report.dst == url and report.skipped == 4
    local = tmp_path / "fixture.wds"
    convert(imagefolder, local, OPTIONS)
    same_bytes_as_local(url, local)
    assert [open_dataset(url).record(i) for i in range(5)] == [open_dataset(local).record(i) for i in range(5)]
    with pytest.raises(ConvertError, match="already exists; pass --overwrite"):
        convert(imagefolder, url, OPTIONS)
    with pytest.raises(ConvertError, match="only .wds datasets can be written to object storage"):
        convert(imagefolder, s3.bucket("other") + "/x.lmdb", OPTIONS)


@pytest.mark.full  # make test-full and CI; a killed local conversion is in make test (tests/converters)
def test_a_killed_conversion_to_s3_does_not_open_and_resume_completes_it(s3, big_source, tmp_path):  # noqa: F811
    url = s3.bucket("out") + "/big.wds"
    args = ["convert", str(big_source), url, "--workers", "2", "--shard-size", "64KiB", "-q"]
    kill_convert_when_stopped(args, after_shards(3))
    store = RemoteStore(url)
    assert "manifest.json" not in store.list()
    with pytest.raises(StoreNotFound, match="its conversion did not finish"):
        open_dataset(url)
    with pytest.raises(ConvertError, match="pass --resume to finish it"):
        convert(big_source, url, OPTIONS)
    assert any(name.endswith(".records.json") for name in store.list())  # finished shards, kept for --resume
    resumed = subprocess.run([sys.executable, "-m", "datapipe", *args, "--resume"], capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    local = tmp_path / "big.wds"
    convert(big_source, local, ConvertOptions(workers=2, progress=False, shard_bytes=64 << 10))
    same_bytes_as_local(url, local)


def upload_folder(s3, folder: Path, bucket: str) -> str:
    """Every file of `folder` (symlinks followed, as the scan follows them) as objects under a prefix."""
    url = s3.bucket(bucket) + "/raw"
    store = RemoteStore(url)
    for root, _, files in os.walk(folder, followlinks=True):
        for name in files:
            path = Path(root) / name
            store.upload(path.relative_to(folder).as_posix(), path)
    return url


def same_dataset_files(a: Path, b: Path, *, same_source: bool = True) -> None:
    """Every file byte-identical; the manifests equal but for when, how long and (unless
    `same_source`) where from."""
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir()) and any(n.endswith(".tar") for n in names)
    for name in names:
        if name != "manifest.json":
            assert (a / name).read_bytes() == (b / name).read_bytes(), name
    ma, mb = (json.loads((p / "manifest.json").read_text()) for p in (a, b))
    for manifest in (ma, mb):
        manifest.pop("created"), manifest.pop("seconds")
    assert (ma["arguments"].pop("source") == mb["arguments"].pop("source")) == same_source
    assert ma == mb


def test_converting_from_s3_writes_what_converting_the_folder_writes(s3, imagefolder, tmp_path):
    source = upload_folder(s3, imagefolder, "raw-images")
    report = convert(source, tmp_path / "from-s3.wds", OPTIONS)
    assert report.skipped == 4 and json.loads((tmp_path / "from-s3.wds/manifest.json").read_text())[
        "arguments"]["source"] == source
    convert(imagefolder, tmp_path / "from-disk.wds", OPTIONS)
    same_dataset_files(tmp_path / "from-s3.wds", tmp_path / "from-disk.wds", same_source=False)
    with pytest.raises(ConvertError, match="from object storage writes .wds only"):
        convert(source, tmp_path / "x.lmdb", OPTIONS)
    with pytest.raises(ValueError, match="Found 0 images"):
        convert(s3.bucket("empty-bucket") + "/nothing", tmp_path / "y.wds", OPTIONS)
