"""One training run per --out (#38 row 10): rank 0 holds OUT/train.lock for the whole run, so a second
`datapipe train` on the same folder is refused in one line naming the holder; a killed run's lock is
taken over; temp files carry names of their own, so two writers of one file never share one."""
import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from datapipe.storage.durable import atomic_write
from datapipe.storage.output_lock import OutputLocked
from datapipe.train import DistEnv
from datapipe.train.out_lock import LOCK_NAME, out_lock
from tests.conftest import IMAGEFOLDER
from tests.processes import holding

REPO = Path(__file__).resolve().parents[2]
HOLD = """
import sys
from datapipe.train import DistEnv
from datapipe.train.out_lock import out_lock
with out_lock(sys.argv[1], DistEnv()):
    print("held", flush=True)
    sys.stdin.read()
"""


@pytest.fixture
def holder(tmp_path):
    """A real process holding the lock of tmp_path/run, as a live `datapipe train --out tmp_path/run` does."""
    out = tmp_path / "run"
    with holding(HOLD, str(out), cwd=REPO) as proc:
        yield out, proc


def test_a_second_train_on_the_same_out_is_refused_in_one_line_naming_the_holder(holder):
    out, proc = holder
    done = subprocess.run([sys.executable, "-m", "datapipe", "train", str(IMAGEFOLDER), "--out", str(out),
                           "--epochs", "1"], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and f"another training run with --out {out} is running" in lines[0], done.stderr
    assert f"pid {proc.pid}" in lines[0] and "host " in lines[0], done.stderr
    assert json.loads((out / LOCK_NAME).read_text())["pid"] == proc.pid  # the holder's lock untouched
    assert sorted(p.name for p in out.iterdir()) == [LOCK_NAME]  # nothing else written


def test_a_killed_runs_lock_is_taken_over_and_released_at_the_end(holder, caplog):
    out, proc = holder
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    with out_lock(out, DistEnv()):
        assert json.loads((out / LOCK_NAME).read_text())["pid"] != proc.pid
    assert "taking over the lock" in caplog.text and not (out / LOCK_NAME).exists()


def test_only_rank_0_takes_the_lock(holder):
    out, _ = holder
    with out_lock(out, DistEnv(rank=1, world_size=2)):  # rank 1 writes nothing under --out
        pass
    with pytest.raises(OutputLocked, match="another training run"):
        with out_lock(out, DistEnv(rank=0, world_size=2)):
            pass


def test_two_writers_of_one_file_each_write_their_own_temp_file(tmp_path):
    """Two saves of OUT/last.pt at once (three `train --resume` on one --out did this): with one fixed
    `last.pt.tmp`, the second truncated the first's and its rename found none ("No such file")."""
    target = tmp_path / "last.pt"
    with contextlib.ExitStack() as both:
        first = both.enter_context(atomic_write(target))
        second = both.enter_context(atomic_write(target))
        first.write(b"first")
        second.write(b"second")
    assert target.read_bytes() == b"first"  # the outer block ends last: its file replaced the other's
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt"]


def test_a_failed_write_removes_its_temp_file_and_keeps_the_old_version(tmp_path):
    target = tmp_path / "last.pt"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError), atomic_write(target) as fh:
        fh.write(b"half")
        raise RuntimeError("killed mid-write")
    assert target.read_bytes() == b"old" and sorted(p.name for p in tmp_path.iterdir()) == ["last.pt"]


ESCAPES = "\x1b]0;pwned\x07\x1b[2J\x1b[H\u202e"  # retitle the terminal, clear it, home, right-to-left override


def planted(out: Path, **fields) -> Path:
    """OUT/train.lock as another host's live run would have it (fresh), holding `fields`."""
    out.mkdir(parents=True, exist_ok=True)
    lock = out / LOCK_NAME
    lock.write_text(json.dumps({"host": "node-b", "pid": 4242, "since": "2026-11-25T10:00:00+00:00", **fields}))
    return lock


def test_a_hostile_locks_fields_are_shown_escaped_and_cut(tmp_path):
    """#47 row 8: a group-writable --out whose train.lock fields are terminal escapes: the refusal is one
    short line with every field escaped and cut to 64 characters (it printed them raw)."""
    out = tmp_path / "run"
    planted(out, host=ESCAPES * 60 + "node-b", pid=ESCAPES * 20, since=["x" * 100])
    assert (out / LOCK_NAME).stat().st_size < 4096  # read as a lock: the refusal names the holder
    done = subprocess.run([sys.executable, "-m", "datapipe", "train", str(IMAGEFOLDER), "--out", str(out),
                           "--epochs", "1"], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert f"another training run with --out {out} is running (host \\x1b]0;pwned\\x07" in line
    assert line.isprintable() and len(line) < 2 * len(str(out)) + 400, line
    assert "pid \\x1b]0;pwned" in line and "started ['xxxx" in line


def test_a_lock_file_of_60_kb_is_not_read_as_a_lock(tmp_path, caplog):
    """A lock is ~100 bytes: a 60 KB one (a 60 KB host field of escapes) is not one this code wrote; it
    is read no further than 4 KB, named nowhere, and the run takes the folder (the old code refused it,
    printing the 60 KB field whole)."""
    out = tmp_path / "run"
    lock = planted(out, host=ESCAPES * (62_000 // len(json.dumps(ESCAPES))))
    assert 58_000 < lock.stat().st_size < 65_536  # whole within the old reader's 64 KiB
    with out_lock(out, DistEnv()):
        assert json.loads(lock.read_text())["pid"] == os.getpid()
    assert all(len(r.getMessage()) < 400 and "\x1b" not in r.getMessage() for r in caplog.records)
