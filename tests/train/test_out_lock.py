"""One training run per --out (#38 row 10): rank 0 holds OUT/train.lock for the whole run, so a second
`datapipe train` on the same folder is refused in one line naming the holder; a killed run's lock is
taken over; temp files carry names of their own, so two writers of one file never share one."""
import contextlib
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from datapipe.durable import atomic_write
from datapipe.output_lock import OutputLocked
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
