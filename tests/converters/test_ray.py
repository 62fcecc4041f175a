"""`--engine ray` on a local Ray (2 CPUs, loopback, a scratch HOME): the bytes `--engine local`
writes, a task killed mid-shard and retried, `--resume` after the driver is killed, S3, refusals."""
from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import ray

from converters import ConvertError, ConvertOptions, convert, list_tasks
from converters.engines.ray import RayEngine
from datapipe import read_manifest
from datapipe.formats import staging_path
from datapipe.ray_setup import loopback_only
from tests.conftest import IMAGEFOLDER
from tests.converters.faults import always_fails, dies_mid_shard_once
from tests.converters.stopping import after_shards, kill_convert_when_stopped
from tests.converters.test_resume import big_source  # noqa: F401  (a fixture: 900 images and two bad files)
from tests.storage.conftest import s3  # noqa: F401  (moto's S3 server on 127.0.0.1)
from tests.converters.test_imagenet_archives import download  # noqa: F401  (a fixture: synthetic archives)
from tests.storage.test_convert_remote import same_bytes_as_local, same_dataset_files, upload_folder

OPTIONS = dict(progress=False, shard_bytes=64 << 10)


@pytest.fixture(scope="module")
def local_ray(ray_home):
    saved = os.environ.get("HOME")
    os.environ["HOME"] = str(ray_home)  # Ray writes an auth token under ~/.ray
    with loopback_only():  # 127.0.0.1 only: Ray on Linux otherwise listens on every interface
        ray.init(num_cpus=2, include_dashboard=False, object_store_memory=80 << 20, _node_ip_address="127.0.0.1",
                 _temp_dir=str(ray_home / "t"), logging_level="WARNING", log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()
        if saved is not None:
            os.environ["HOME"] = saved


@pytest.mark.parametrize("source", ["fixtures", "big"])
def test_ray_writes_the_bytes_local_writes(local_ray, source, big_source, tmp_path):  # noqa: F811
    src = IMAGEFOLDER if source == "fixtures" else big_source
    convert(src, tmp_path / "local.wds", ConvertOptions(**OPTIONS, workers=2))
    report = convert(src, tmp_path / "ray.wds", ConvertOptions(**OPTIONS, engine="ray"))
    assert report.skipped == (4 if source == "fixtures" else 2)
    same_dataset_files(tmp_path / "local.wds", tmp_path / "ray.wds")


def test_a_task_killed_mid_shard_is_retried_to_the_same_bytes(local_ray, big_source, tmp_path):  # noqa: F811
    marker = tmp_path / "killed"
    engine = RayEngine(build=functools.partial(dies_mid_shard_once, marker=marker, shard="train-000002"))
    convert(big_source, tmp_path / "ray.wds", ConvertOptions(**OPTIONS), engine=engine)
    assert marker.exists()  # the fault did happen: a worker died with a partial shard
    convert(big_source, tmp_path / "local.wds", ConvertOptions(**OPTIONS, workers=2))
    same_dataset_files(tmp_path / "local.wds", tmp_path / "ray.wds")


def test_a_shard_that_keeps_failing_stops_the_run_naming_it(local_ray, tmp_path):
    attempts = tmp_path / "attempts"
    engine = RayEngine(max_retries=1, build=functools.partial(always_fails, attempts=attempts))
    dst = tmp_path / "out.wds"
    with pytest.raises(OSError, match="No space left on device"):
        convert(IMAGEFOLDER, dst, ConvertOptions(**OPTIONS), engine=engine)
    tried = attempts.read_text().split()
    assert tried and all(tried.count(name) <= 2 for name in tried) and max(map(tried.count, tried)) == 2
    assert staging_path(dst).is_dir() and not dst.exists()  # kept for --resume


def test_strict_stops_at_a_bad_file_and_keeps_nothing(local_ray, big_source, tmp_path):  # noqa: F811
    dst = tmp_path / "out.wds"
    with pytest.raises(ConvertError, match=r"zz_(truncated|empty)\.jpg: .*--strict stops"):
        convert(big_source, dst, ConvertOptions(**OPTIONS, engine="ray", strict=True))
    assert not dst.exists() and not staging_path(dst).exists()


def test_resume_after_the_driver_is_killed(local_ray, ray_home, big_source, tmp_path):  # noqa: F811
    dst = tmp_path / "out.wds"
    args = ["convert", str(big_source), str(dst), "--engine", "ray", "--shard-size", "64KiB", "-q"]
    env = {**os.environ, "HOME": str(ray_home / "driver")}  # the killed driver starts a Ray of its own
    kill_convert_when_stopped(args, after_shards(2, engine="ray"), env=env)
    finished = len(list(staging_path(dst).glob("*.records.json")))
    assert finished >= 2 and not dst.exists()
    report = convert(big_source, dst, ConvertOptions(**OPTIONS, engine="ray", resume=True))
    assert 0 < report.processed < len(list_tasks(big_source).tasks)  # the finished shards were kept
    convert(big_source, tmp_path / "local.wds", ConvertOptions(**OPTIONS, workers=2))
    same_dataset_files(tmp_path / "local.wds", dst)


def test_ray_writes_to_s3(local_ray, s3, tmp_path):  # noqa: F811
    """The fixture folder (4 shards of 64 KiB, 4 bad files): the 900-image source took 79 s here, for
    the same check (that one's bytes are compared locally above)."""
    url = s3.bucket("ray-out") + "/fixtures.wds"  # moto keeps its buckets for the whole process: a name of its own
    convert(IMAGEFOLDER, url, ConvertOptions(**OPTIONS, engine="ray"))
    local = tmp_path / "fixtures.wds"
    convert(IMAGEFOLDER, local, ConvertOptions(**OPTIONS, workers=2))
    same_bytes_as_local(url, local)


@pytest.mark.parametrize("suffix", [".lmdb", ".h5"])
def test_single_writer_formats_are_refused(suffix, tmp_path):
    with pytest.raises(ConvertError, match=r"--engine ray writes \.wds only.*Convert to \.wds"):
        convert(IMAGEFOLDER, tmp_path / f"out{suffix}", ConvertOptions(**OPTIONS, engine="ray"))
    done = subprocess.run([sys.executable, "-m", "datapipe", "convert", str(IMAGEFOLDER), str(tmp_path / f"x{suffix}"),
                           "--engine", "ray"], capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "writes .wds only" in done.stderr


def test_ray_reads_the_images_from_s3(local_ray, s3, tmp_path):  # noqa: F811
    source = upload_folder(s3, IMAGEFOLDER, "ray-raw")
    convert(source, tmp_path / "ray.wds", ConvertOptions(**OPTIONS, engine="ray"))
    convert(IMAGEFOLDER, tmp_path / "local.wds", ConvertOptions(**OPTIONS, workers=2))
    same_dataset_files(tmp_path / "ray.wds", tmp_path / "local.wds", same_source=False)


OWN_RAY = """
import json, os, psutil
from converters.engines.ray import connect
from datapipe.ray_local import _running
ray, owned = connect(None)
ours = {c.pid for c in psutil.Process().children(recursive=True)} | {os.getpid()}
listening = sorted({c.laddr.ip for c in psutil.net_connections("tcp") if c.status == psutil.CONN_LISTEN and c.pid in ours})
its = [" ".join(p.cmdline()) for p in psutil.Process().children(recursive=True)]
print(json.dumps({"owned": owned, "node": ray.nodes()[0]["NodeManagerAddress"], "listening": listening,
                  "folder": str(_running[0]), "in_folder": any(str(_running[0]) in line for line in its),
                  "seven": ray.get(ray.put(7))}))
ray.shutdown()
"""


def test_a_conversions_own_ray_listens_on_loopback_only_in_a_folder_of_its_own(tmp_path, monkeypatch):
    """With no --ray-address and no RAY_ADDRESS, the conversion's own Ray binds and advertises 127.0.0.1
    only (before: every interface, at the machine's address). Its files go to a new folder of its own
    (mode 0700), under /tmp where the temp folder is too long for Ray's socket paths (a Slurm job's
    $TMPDIR often is: AF_UNIX allows 107 bytes), removed at exit (before: a session folder left a run)."""
    from datapipe.ray_local import PREFIX, session_folder

    long = tmp_path / ("job-" + "x" * 60)
    long.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(long))
    made = session_folder()
    assert made.parent == Path("/tmp") and made.name.startswith(PREFIX) and made.stat().st_mode & 0o777 == 0o700
    made.rmdir()
    short = Path(tempfile.mkdtemp(prefix="s", dir="/tmp"))
    monkeypatch.setattr(tempfile, "tempdir", str(short))
    made = session_folder()
    assert made.parent == short
    shutil.rmtree(short)
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")}
    done = subprocess.run([sys.executable, "-c", OWN_RAY], env={**env, "TMPDIR": str(long), "HOME": str(tmp_path)},
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-1500:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["owned"] and got["seven"] == 7 and got["node"] == "127.0.0.1"
    assert got["listening"] and set(got["listening"]) <= {"127.0.0.1", "::ffff:127.0.0.1"}, got["listening"]
    assert got["folder"].startswith(f"/tmp/{PREFIX}") and got["in_folder"]
    assert not Path(got["folder"]).exists() and list(long.iterdir()) == []  # nothing left behind
    assert "Token authentication is enabled" not in done.stderr  # Ray's notice at every local start, kept quiet


def test_ray_reads_imagenet_archive_members_into_the_shards_the_local_engine_writes(local_ray, download, tmp_path):  # noqa: F811
    """converters.imagenet: the Ray workers read each member's byte range of the train tar (here, in
    the module of the one local Ray: a second Ray started in one pytest process timed out)."""
    from tests.converters.test_imagenet_archives import BAD, OPTIONS as ARCHIVE_OPTIONS

    convert(download, tmp_path / "local.wds", ConvertOptions(**ARCHIVE_OPTIONS))
    convert(download, tmp_path / "ray.wds", ConvertOptions(**{**ARCHIVE_OPTIONS, "workers": 0}, engine="ray"))
    same_dataset_files(tmp_path / "local.wds", tmp_path / "ray.wds")
    assert [s["path"] for s in read_manifest(tmp_path / "ray.wds").splits["train"].skipped] == [BAD]
