"""Expected failures: one line, a non-zero exit, nothing lost. Bad manifests, an unwritable or
full destination, a kill between building an HDF5 file and publishing it."""
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from converters import ConvertOptions, convert
from datapipe import open_dataset
from tests.conftest import IMAGEFOLDER

QUIET = dict(workers=1, progress=False)


def run(*args, **kw):
    return subprocess.run([sys.executable, "-m", "datapipe", *map(str, args)], capture_output=True, text=True, **kw)


def one_line_error(done, code=None):
    assert done.returncode != 0 and (code is None or done.returncode == code), done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    return done.stderr


@pytest.mark.parametrize("text", ["[]", '{"version": 1}', "{not json", '{"version": 1, "format": "lmdb", '
                                  '"classes": [], "splits": {"train": {"samples": -3}}}', '"a string"'])
@pytest.mark.parametrize("name", ["packed_lmdb", "packed_wds"])  # HDF5 keeps its manifest inside the file
def test_a_garbled_manifest_is_a_value_error_naming_it(request, tmp_path, name, text):

    packed_copy = tmp_path / "copy"
    shutil.copytree(request.getfixturevalue(name), packed_copy)
    (packed_copy / "manifest.json").write_text(text)
    with pytest.raises(ValueError, match=r"manifest.json .*re-convert"):
        open_dataset(packed_copy)
    assert "manifest.json" in one_line_error(run("info", packed_copy), 2)


def test_hdf5_killed_between_close_and_publish_resumes(tmp_path, monkeypatch):
    import converters.pack

    dst = tmp_path / "out.h5"

    def killed(*args):
        raise KeyboardInterrupt  # what a kill right after the file was built looks like to the staging folder

    monkeypatch.setattr(converters.pack, "publish", killed)
    with pytest.raises(KeyboardInterrupt):
        convert(IMAGEFOLDER, dst, ConvertOptions(**QUIET, checkpoint_every=5))
    monkeypatch.undo()
    convert(IMAGEFOLDER, dst, ConvertOptions(**QUIET, checkpoint_every=5, resume=True))
    clean = tmp_path / "clean.h5"
    convert(IMAGEFOLDER, clean, ConvertOptions(**QUIET))
    for split in ("train", "val"):
        assert list(open_dataset(dst, split)) == list(open_dataset(clean, split))


def test_an_unwritable_destination_is_one_line(tmp_path):
    """A folder nobody may write into: read-only by mode for a user; for root, which CI runs as and
    which ignores mode bits, an immutable folder (chattr +i), or where the filesystem has no such
    flag, a folder under sysfs, where even root cannot create anything."""
    locked = tmp_path / "locked"
    locked.mkdir()
    immutable = False
    if os.geteuid() != 0:
        locked.chmod(0o555)
    elif shutil.which("chattr") and subprocess.run(["chattr", "+i", str(locked)], capture_output=True).returncode == 0:
        immutable = True
    else:
        locked = Path("/sys/datapipe-unwritable")
    try:
        done = run("convert", IMAGEFOLDER, locked / "out.lmdb", "--workers", "1")
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(locked)], check=True)
    message = one_line_error(done, 1)
    assert ("Permission denied" in message or "Operation not permitted" in message) and str(locked) in message


def test_a_full_disk_keeps_the_finished_part_for_resume(tmp_path):
    """RLIMIT_FSIZE makes writes past 100 KB fail as a full disk does (EFBIG instead of ENOSPC)."""
    dst = tmp_path / "out.wds"

    def small_disk():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))

    done = run("convert", IMAGEFOLDER, dst, "--workers", "1", "--shard-size", "1MB", "--checkpoint-every", "3",
               preexec_fn=small_disk)
    message = one_line_error(done, 1)
    assert "too large" in message and "--resume" in message and not dst.exists()
    assert (tmp_path / "out.wds.partial").is_dir()
    assert run("convert", IMAGEFOLDER, dst, "--workers", "1", "--shard-size", "1MB", "--checkpoint-every", "3",
               "--resume").returncode == 0
    clean = tmp_path / "clean.wds"
    convert(IMAGEFOLDER, clean, ConvertOptions(**QUIET, shard_bytes=1_000_000))
    for name in sorted(p.name for p in clean.glob("*.tar")):
        assert (dst / name).read_bytes() == (clean / name).read_bytes()
    assert json.loads((dst / "manifest.json").read_text())["splits"] == json.loads(
        (clean / "manifest.json").read_text())["splits"]
