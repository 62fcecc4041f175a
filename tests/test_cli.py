"""The `datapipe` command as a user runs it: exit codes, JSON shape, messages."""
import json
import subprocess
import sys

import pytest

from datapipe.cli import parse_size
from tests.conftest import IMAGEFOLDER


def run(*args):
    return subprocess.run([sys.executable, "-m", "datapipe", *map(str, args)], capture_output=True, text=True)


def test_convert_then_info_json(tmp_path):
    dst = tmp_path / "out.wds"
    done = run("convert", IMAGEFOLDER, dst, "--workers", "2")
    assert done.returncode == 0, done.stderr
    assert "train: 27 samples" in done.stdout and "4 skipped" in done.stdout
    assert "skipped train/dog/empty.jpg: empty file" in done.stdout
    info = json.loads(run("info", dst, "--json").stdout)
    assert info["format"] == "wds" and info["classes"] == ["cat", "dog", "fish"]
    assert info["splits"]["train"]["samples"] == 27 and info["splits"]["val"]["samples"] == 4
    assert {"path", "reason"} <= set(info["splits"]["train"]["skipped"][0])
    assert info["errors"] == 4 and info["arguments"]["format"] == "wds"
    again = run("convert", IMAGEFOLDER, dst)
    assert again.returncode == 2 and "already exists; pass --overwrite" in again.stderr


def test_strict_exits_nonzero_naming_the_file(tmp_path):
    done = run("convert", IMAGEFOLDER, tmp_path / "out.lmdb", "--strict", "--workers", "1")
    assert done.returncode == 2 and "truncated.jpg" in done.stderr and "--strict" in done.stderr


def test_info_on_a_plain_folder(tmp_path):
    info = json.loads(run("info", IMAGEFOLDER, "--json").stdout)
    assert info["format"] == "folder" and info["splits"]["val"]["samples"] == 4


@pytest.mark.parametrize("text, value", [("256MB", 256_000_000), ("1GiB", 1 << 30), ("4096", 4096),
                                         ("64KiB", 65536), ("1.5 GB", 1_500_000_000)])
def test_parse_size(text, value):
    assert parse_size(text) == value


def test_parse_size_rejects_nonsense():
    with pytest.raises(Exception, match="is not a size"):
        parse_size("lots")


def test_convert_info_and_verify_do_not_import_torch(tmp_path):
    """They need no torch, and importing it cost 1.4-1.6 s of every start."""
    import subprocess
    import sys

    from tests.conftest import IMAGEFOLDER

    code = ("import sys; from datapipe.cli import main; "
            f"main(['convert', {str(IMAGEFOLDER)!r}, {str(tmp_path / 'x.wds')!r}, '-q']); "
            f"main(['info', {str(tmp_path / 'x.wds')!r}]); main(['verify', {str(tmp_path / 'x.wds')!r}]); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "False"
