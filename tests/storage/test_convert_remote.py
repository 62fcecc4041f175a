"""`datapipe convert SRC s3://...`: the same bytes as a local conversion, the manifest last, kill and
--resume, and the refusals a local destination gets."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from converters import ConvertError, ConvertOptions, convert
from converters.remote import work_folder
from datapipe import open_dataset
from datapipe.storage import RemoteStore, StoreNotFound

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
    assert not work_folder(url).parent.exists()  # the local work copy is gone
    with pytest.raises(ConvertError, match="already exists; pass --overwrite"):
        convert(imagefolder, url, OPTIONS)
    with pytest.raises(ConvertError, match="only .wds datasets can be written to object storage"):
        convert(imagefolder, s3.bucket("other") + "/x.lmdb", OPTIONS)


def test_a_killed_conversion_to_s3_does_not_open_and_resume_completes_it(s3, big_source, tmp_path):  # noqa: F811
    url = s3.bucket("out") + "/big.wds"
    args = ["convert", str(big_source), url, "--workers", "2", "--checkpoint-every", "40", "--shard-size", "64KiB", "-q"]
    # The converter stops itself (SIGSTOP) right after the checkpoint past 300 files; the test waits for
    # that stop, not for a time, then kills it: no race with a conversion that finishes first.
    stop_at_300 = ("import os, signal, sys; from converters.staging import Progress; save = Progress.save\n"
                   "def checkpoint(self, staging):\n"
                   "    save(self, staging)\n"
                   "    if self.done >= 300: os.kill(os.getpid(), signal.SIGSTOP)\n"
                   "Progress.save = checkpoint\n"
                   f"from datapipe.cli import main; sys.exit(main({args!r}))")
    proc = subprocess.Popen([sys.executable, "-c", stop_at_300], start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status = os.waitpid(proc.pid, os.WUNTRACED)
    assert os.WIFSTOPPED(status), f"the conversion ended before its checkpoint at 300 files (status {status})"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    store = RemoteStore(url)
    assert "manifest.json" not in store.list()
    with pytest.raises(StoreNotFound, match="its conversion did not finish"):
        open_dataset(url)
    with pytest.raises(ConvertError, match="pass --resume to finish it"):
        convert(big_source, url, OPTIONS)
    resumed = subprocess.run([sys.executable, "-m", "datapipe", *args, "--resume"], capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    local = tmp_path / "big.wds"
    convert(big_source, local, ConvertOptions(workers=2, progress=False, shard_bytes=64 << 10, checkpoint_every=40))
    same_bytes_as_local(url, local)
