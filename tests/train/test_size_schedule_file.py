"""#47 rows 5-6: `datapipe train --image-size-schedule FILE` reads a regular file of at most
SCHEDULE_MAX_BYTES, never blocking on a FIFO or reading a device; JSON nested past the recursion limit,
a key given twice, null or a schedule's own fault is one line naming the file and the fix, and 200,000
alternating sizes cost linear work (counted, not timed)."""
from __future__ import annotations

import argparse
import json
import os
import re
import socket
import tracemalloc

import pytest

from datapipe.cli.main import main
from datapipe.cli.train import SCHEDULE_MAX_BYTES, size_schedule_file
from datapipe.train.config import TrainConfig
from tests.augment.test_resolution_schedule import Work
from tests.processes import deadline

FORM = re.escape('{"0": 160, "10": 192}')


def plant(path, kind: str) -> None:
    """A schedule file of `kind` at `path`."""
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "folder":
        path.mkdir()
    elif kind in ("over-limit", "1 GB"):
        with open(path, "wb") as fh:  # sparse: no disk, and nothing to read if it is refused unread
            fh.truncate(SCHEDULE_MAX_BYTES + 1 if kind == "over-limit" else 1 << 30)
    else:
        path.write_bytes({"deep": b"[" * 100_000 + b"]" * 100_000, "deep-object": b'{"0":' * 100_000,
                          "null": b"null", "twice": b'{"0": 160, "5": 192, "0": 224}', "latin-1": b'{"\xe9": 1}',
                          "not JSON": b"0: 160\n10: 192\n", "epoch 0 missing": b'{"1": 32}',
                          "huge int": b"[" + b"9" * 5000 + b"]", "float": b"[160, 192.0]"}[kind])


REFUSALS = {
    "fifo": rf"is a FIFO, not a regular file; a size schedule must be a file: write the schedule to a file",
    "dev-zero": r"is a character device, not a regular file; a size schedule must be a file",
    "folder": r"is a folder, not a regular file",
    "over-limit": rf"is 4,194,305 bytes, over the 4,194,304 bytes a size schedule may hold: give the sizes where "
                  rf"they change, {FORM}$",
    "1 GB": r"is 1,073,741,824 bytes, over the 4,194,304 bytes a size schedule may hold",
    "deep": rf"nests JSON too deep to read \(past \d+ levels\); a schedule is flat: {FORM}",
    "deep-object": r"nests JSON too deep to read",
    "null": rf"holds null, not a schedule; give a file holding {FORM}",
    "twice": r": cannot read it as JSON \(the key '0' is given twice: keep one\)",
    "latin-1": r"is not UTF-8 text \(byte 2\); write it as UTF-8",
    "not JSON": r": cannot read it as JSON \(Extra data: line 1 column 2",
    "epoch 0 missing": r": image_size: the schedule \{'1': 32\} does not give epoch 0's size; start it at epoch 0",
    "huge int": r": cannot read it as JSON \(Exceeds the limit \(4300 digits\)",
    "float": r": image_size of epoch 1 must be within 8..8192 \(an int, .*got 192.0$",
}


@pytest.mark.parametrize("kind", sorted(REFUSALS))
def test_a_bad_schedule_file_is_one_line_naming_it_and_exit_2(tmp_path, capsys, kind):
    schedule = tmp_path / "sizes.json"
    plant(schedule, kind)
    with deadline(20):
        assert main(["train", str(tmp_path / "data"), "--out", str(tmp_path / "run"),
                     "--image-size-schedule", str(schedule)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and len(err) < 400, err
    assert err.startswith(f"datapipe train: error: --image-size-schedule {schedule}"), err
    assert re.search(REFUSALS[kind], err), err


def test_a_socket_and_a_path_with_control_characters_are_one_line(tmp_path):
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(tmp_path / "s.json"))
        with pytest.raises(ValueError, match=r"s\.json is a socket, not a regular file"):
            read(tmp_path / "s.json")
    odd = tmp_path / "a\nb\x1b[31m.json"
    odd.write_text("[7]")
    with pytest.raises(ValueError, match=r"^--image-size-schedule '.*a\\nb\\x1b\[31m\.json': image_size of epoch 0 "
                                         r"must be within 8..8192") as refused:
        read(odd)
    assert str(refused.value).isprintable()


def read(path) -> object:
    return size_schedule_file(argparse.Namespace(image_size_schedule=str(path)))


@pytest.mark.forked  # tracemalloc in a child with one thread (tests/forked.py)
def test_a_1_gb_schedule_is_refused_unread_and_a_small_one_read_in_small_memory(tmp_path):
    """Row 5: a 1 GB file was read whole (2.2 GB); it is refused from its size, nothing read. A 30-byte
    schedule is read into its size, not into a buffer of the bound (read(4 MB + 1) allocates 4 MB)."""
    plant(tmp_path / "big.json", "1 GB")
    (tmp_path / "small.json").write_text('{"0": 160, "10": 192}')
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match="over the 4,194,304 bytes"):
            read(tmp_path / "big.json")
        big = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        assert read(tmp_path / "small.json") == {"0": 160, "10": 192}
        small = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert big < 1 << 20 and small < 1 << 20, (big, small)


def test_200000_alternating_sizes_cost_linear_work(tmp_path, monkeypatch):
    """Row 6: a 2 MB file of 200,000 alternating sizes took > 60 s (a max() over the changes so far at
    each point). The elements looked at, counted, are a few per entry."""
    sizes = [160, 192] * 100_000
    (tmp_path / "alt.json").write_text(json.dumps(sizes))
    work = Work(monkeypatch, budget=10 * len(sizes))
    config = TrainConfig(data="d", out="o", image_size=read(tmp_path / "alt.json"), epochs=3)
    assert config.image_size == dict(enumerate(sizes)) and config.eval_size == 192
    assert config.train_sizes(199_998) == 160 and config.train_sizes(10**6) == 192
    assert work.seen <= 10 * len(sizes)


def test_a_schedule_file_with_a_bom_or_spaces_reads_as_written(tmp_path):
    (tmp_path / "s.json").write_bytes(b'\xef\xbb\xbf{"0": 128, " 10 ": 160, "20": 192}\n')
    assert TrainConfig(data="d", out="o", image_size=read(tmp_path / "s.json")).image_size == {0: 128, 10: 160,
                                                                                             20: 192}
