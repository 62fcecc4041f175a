"""The `datapipe` command as a user runs it: exit codes, JSON shape, messages."""
import json
import subprocess
import sys

import pytest

from datapipe.cli.flags import parse_size
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

    code = ("import sys; from datapipe.cli.main import main; "
            f"main(['convert', {str(IMAGEFOLDER)!r}, {str(tmp_path / 'x.wds')!r}, '-q']); "
            f"main(['info', {str(tmp_path / 'x.wds')!r}]); main(['verify', {str(tmp_path / 'x.wds')!r}]); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "False"


def test_top_level_help_is_help_text_not_a_code_comment():
    """Was: `datapipe --help` ended its description with "Environment reads live here only." (the module's docstring)."""
    done = run("--help")
    assert done.returncode == 0 and "Environment reads" not in done.stdout
    assert "Pack image datasets (LMDB, HDF5, WebDataset)" in done.stdout


def test_dangling_symlinks_where_folders_are_are_skipped_entries_with_their_paths(tmp_path):
    """Was: a class folder that is a link to nothing was dropped by convert without a line."""
    import os
    import shutil

    src = tmp_path / "src"
    shutil.copytree(IMAGEFOLDER, src)  # the fixture's own folder link copied as a folder
    os.symlink(tmp_path / "gone/bird", src / "train/bird")  # a class folder
    os.symlink("../../nowhere", src / "train/dog/more")  # a folder inside a class
    os.symlink(tmp_path / "gone/test", src / "test")  # a split folder
    done = run("convert", src, tmp_path / "out.lmdb", "--workers", "1", "-q")
    assert done.returncode == 0, done.stderr
    for path, target in (("test", tmp_path / "gone/test"), ("train/bird", tmp_path / "gone/bird"),
                         ("train/dog/more", "../../nowhere")):
        assert f"  skipped {path}: dangling symlink (to {target}): no folder there" in done.stdout, done.stdout
    assert "train: 27 samples" in done.stdout and "7 skipped" in done.stdout
    info = json.loads(run("info", tmp_path / "out.lmdb", "--json").stdout)
    assert {"test", "train/bird", "train/dog/more"} <= {s["path"] for s in info["splits"]["train"]["skipped"]}
    assert info["classes"] == ["cat", "dog", "fish"]


def test_info_names_the_classes_and_counts_in_the_singular(tmp_path):
    """Was: `datapipe info` said '3 classes' (no names) and '1 shards'."""
    import shutil

    done = run("info", IMAGEFOLDER)
    assert done.stdout.splitlines()[0] == f"{IMAGEFOLDER}: folder, 3 classes: cat, dog, fish"
    many = tmp_path / "many"
    for k in range(1000):
        (many / f"n{k:08d}").mkdir(parents=True)
    shutil.copy(IMAGEFOLDER / "train/cat/cat_000.jpg", many / "n00000000/one.jpg")
    first = run("info", many).stdout.splitlines()
    assert first[0].startswith(f"{many}: folder, 1000 classes: n00000000, n00000001, ")
    assert first[0].endswith(" more (--json lists them all)") and len(first[0]) < len(str(many)) + 180
    assert first[1] == "  train: 1 sample, 0 skipped"
    assert json.loads(run("info", many, "--json").stdout)["classes"] == [f"n{k:08d}" for k in range(1000)]
    out = tmp_path / "one.wds"
    converted = run("convert", many, out, "-q").stdout.splitlines()
    assert ": 1 file, " in converted[0] and converted[1].startswith("  train: 1 sample, "), converted
    described = run("info", out).stdout
    assert "  train: 1 sample, " in described and ", 1 shard, " in described, described


def test_convert_quiet_prints_no_info_lines(tmp_path):
    """-q meant no progress bar only: an HDF5 conversion still logged 'INFO building ... from the spooled records'."""
    loud = run("convert", IMAGEFOLDER, tmp_path / "loud.h5")
    quiet = run("convert", IMAGEFOLDER, tmp_path / "quiet.h5", "-q")
    assert "INFO" in loud.stderr and quiet.returncode == 0 and "INFO" not in quiet.stderr
    assert "train: 27 samples" in quiet.stdout and "skipped" in quiet.stdout


def test_verify_names_a_missing_path_as_missing(tmp_path, capsys):
    from datapipe.cli.main import main

    assert main(["verify", str(tmp_path / "no such.wds")]) == 2
    err = capsys.readouterr().err
    assert err.strip() == f"datapipe verify: error: {tmp_path / 'no such.wds'} does not exist"
