"""`datapipe doctor DATA`: every command its checks print runs as printed, for a dataset in every format
(an image folder, LMDB, HDF5, .wds), and does what the hint says: bench measures, convert writes the copy.
Each format runs ~5 commands (about a minute here): make test runs LMDB's, make test-full all four."""
from __future__ import annotations

import itertools
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from converters import ConvertOptions, convert
from datapipe import open_dataset
from datapipe.doctor.pipeline import DiskProbe, diagnose

REPO = Path(__file__).resolve().parents[1]
SUBCOMMANDS = "convert|info|verify|bench|train|doctor|preview"
# a command: `datapipe SUB` and its words; it ends at a backtick, a bracket or ", " (", then datapipe ...")
COMMAND = re.compile(rf"datapipe (?:{SUBCOMMANDS})(?: (?:[^\s,`()]|,(?! ))+)*")
SLOW = DiskProbe(least=0, clock=itertools.count(0, 60).__next__)  # every read takes a minute: the slow-disk hints


@pytest.fixture(scope="module")
def datasets(tmp_path_factory) -> dict[str, Path]:
    """A sample big enough for bench's defaults (batch 64 after 2 warm-up batches), in every format."""
    root = tmp_path_factory.mktemp("doctor")
    subprocess.run([sys.executable, "tools/make_sample.py", "--out", str(root / "images"), "--per-class", "70",
                    "--size", "96x72", "--no-extras"], cwd=REPO, check=True, capture_output=True, timeout=300)
    out = {"folder": root / "images"}
    for fmt, suffix in (("lmdb", ".lmdb"), ("hdf5", ".h5"), ("wds", ".wds")):
        out[fmt] = root / f"sample{suffix}"
        convert(root / "images", out[fmt], ConvertOptions(progress=False, workers=1, shard_bytes=256 << 10))
    return out


def printed_commands(data: Path) -> list[str]:
    """The commands in the checks' values and hints, in the order printed, each once."""
    texts = [text for c in diagnose(data, {}, probe=SLOW) for text in (str(c.value), c.hint)]
    return list(dict.fromkeys(m for text in texts for m in COMMAND.findall(text)))


def test_commands_are_found_as_printed():
    hint = "measure it: datapipe convert 'a b' COPY.wds, then datapipe bench 'a b' COPY.wds --suites read,pipeline"
    assert COMMAND.findall(hint) == ["datapipe convert 'a b' COPY.wds",
                                     "datapipe bench 'a b' COPY.wds --suites read,pipeline"]
    assert COMMAND.findall("(`datapipe doctor --gpu` tests it); datapipe runs its CPU path") == ["datapipe doctor --gpu"]


@pytest.mark.parametrize("fmt", ["lmdb", *(pytest.param(f, marks=pytest.mark.full) for f in ("folder", "hdf5", "wds"))])
def test_every_command_doctor_prints_runs_as_printed(datasets, fmt, tmp_path, within):
    """Was: `datapipe convert demo/sample.lmdb COPY.wds`, which convert refused (it read image folders only)."""
    data = datasets[fmt]
    commands = printed_commands(data)
    subcommands = [shlex.split(c)[1] for c in commands]
    assert "bench" in subcommands and ("convert" in subcommands) == (fmt != "wds"), commands  # shards: no repack advice
    for command in commands:
        argv = shlex.split(command)
        done = subprocess.run([sys.executable, "-m", "datapipe", *argv[1:]], cwd=tmp_path, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, (command, done.stderr[-2000:])
        if argv[1] == "convert":  # the copy holds the dataset's records
            copy = tmp_path / argv[3]
            assert len(open_dataset(copy)) == len(open_dataset(data)) and open_dataset(copy).format == "wds"
        else:  # bench: a measured row of each suite for each dataset, none skipped or failed
            suites = argv[argv.index("--suites") + 1].split(",")
            names = [a for a in argv[2:argv.index("--suites")]]
            rows = [line.split() for line in done.stdout.split("\nverdicts\n")[0].splitlines()[2:] if line.strip()]
            assert rows and all("skipped" not in row and "failed:" not in row for row in rows), done.stdout
            for name, suite in itertools.product(names, suites):
                assert any(row[0] == Path(name).name or row[0] == name for row in rows if row[2] == suite), \
                    (command, name, suite, done.stdout)


def test_a_path_with_a_space_is_quoted_in_every_command(packed_lmdb, tmp_path):
    data = tmp_path / "my data.lmdb"
    data.symlink_to(packed_lmdb)
    commands = printed_commands(data)
    assert commands and all(shlex.split(c)[2] == str(data) for c in commands), commands


def test_what_doctor_says_of_a_small_read_a_url_a_pattern_and_shards(packed_wds, tmp_path):
    """Was: a WARN over a 0 MB read, 'does not exist' for a URL or a shard pattern, and 'pack into WebDataset
    shards' (with a convert command) for shards."""
    small = {c.name: c for c in diagnose(packed_wds, {})}["read_speed"]
    assert small.status == "info" and "too little to judge the disk (a verdict needs 32 MB)" in small.hint
    slow = {c.name: c for c in diagnose(packed_wds, {}, probe=SLOW)}["read_speed"]
    assert slow.status == "warn" and "WebDataset shards already" in slow.hint and "datapipe convert" not in slow.hint
    remote = {c.name: c for c in diagnose("s3://bucket/data.wds", {})}
    assert remote["data"].status == "info" and "in object storage" in remote["data"].hint
    assert "read_speed" not in remote and "disk_free" not in remote
    pattern = {c.name: c for c in diagnose(str(tmp_path / "shards-{000000..000009}.tar"), {})}["data"]
    assert "the folder that holds the files" in pattern.hint


def test_doctor_prints_no_control_character_of_a_path(tmp_path):
    data = tmp_path / "d\x1b[2J\x07"
    data.mkdir()
    done = subprocess.run([sys.executable, "-m", "datapipe", "doctor", str(data)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and "\x1b" not in done.stdout and "\x07" not in done.stdout
    assert "d\\x1b[2J\\x07" in done.stdout


def test_a_bench_command_is_fitted_to_the_datas_length():
    """bench times a figure only over a long enough window (bench/sanity.py) and exits 2 where no row has one:
    the doctor's command takes a batch that fits, or gives way to a line saying what bench needs."""
    import torch

    from datapipe.doctor.bench import DEFAULTS, batches_needed, fitted

    cpu, hint = torch.device("cpu"), "measure it: datapipe bench D --suites pipeline"
    needed = batches_needed("pipeline", cpu)
    assert fitted(hint, "pipeline", None, cpu) == hint == fitted(hint, "pipeline", needed * DEFAULTS.batch_size, cpu)
    assert fitted(hint, "pipeline", needed * 3 + 1, cpu).endswith(f"{hint} --batch-size 3")
    too_few = fitted(hint, "pipeline", needed - 1, cpu)
    assert "datapipe bench" not in too_few and f"needs {needed:,} batches" in too_few
    assert batches_needed("loader", cpu) > needed > batches_needed("decode", cpu)
