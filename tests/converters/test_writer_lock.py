"""One writer per output (#34): a second conversion to a path another live conversion holds is refused
in one line naming the holder, and never removes the holder's staging folder; a dead holder's lock
is taken over; another host's lock counts while it is fresh."""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import datapipe.storage.output_lock
from converters import ConvertOptions, convert
from converters.errors import ConvertError
from converters.lock import STALE_S, lock_path, writer_lock
from datapipe import open_dataset
from datapipe.formats import staging_path
from tests.conftest import IMAGEFOLDER
from tests.processes import holding

QUIET = dict(workers=1, progress=False)
HOLD = """
import sys
from pathlib import Path
from converters.lock import writer_lock
with writer_lock(Path(sys.argv[1])):
    print("held", flush=True)
    sys.stdin.read()
"""


@pytest.fixture
def holder(tmp_path):
    """A real second process holding the lock of tmp_path/out.lmdb, with a staging folder of its own."""
    dst = tmp_path / "out.lmdb"
    with holding(HOLD, str(dst), cwd=Path(__file__).resolve().parents[2]) as proc:
        staging = staging_path(dst)
        staging.mkdir()
        (staging / "data.mdb").write_bytes(b"the holder's work")
        yield dst, proc


def test_a_second_conversion_is_refused_naming_the_holder_and_leaves_its_staging(holder):
    dst, proc = holder
    for options in (ConvertOptions(**QUIET), ConvertOptions(overwrite=True, **QUIET), ConvertOptions(resume=True, **QUIET)):
        with pytest.raises(ConvertError, match=rf"another conversion to .*out.lmdb is running \(host .*, pid {proc.pid}, "):
            convert(IMAGEFOLDER, dst, options)
    assert (staging_path(dst) / "data.mdb").read_bytes() == b"the holder's work"
    assert not dst.exists()


def test_the_cli_refusal_is_one_line(holder):
    dst, proc = holder
    done = subprocess.run([sys.executable, "-m", "datapipe", "convert", str(IMAGEFOLDER), str(dst), "--overwrite"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and f"pid {proc.pid}" in done.stderr, done.stderr


def test_a_killed_holders_lock_is_taken_over(holder, caplog):
    dst, proc = holder
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    report = convert(IMAGEFOLDER, dst, ConvertOptions(overwrite=True, **QUIET))
    assert report.splits["train"].samples == len(open_dataset(dst, "train"))
    assert "taking over the lock" in caplog.text and not lock_path(dst).exists()


@pytest.mark.parametrize("age,refused", [(60, True), (STALE_S + 60, False)])
def test_another_hosts_lock_counts_while_it_is_fresh(tmp_path, monkeypatch, age, refused):
    """The lock's age is judged by an injected clock: mtime fixed, "now" = mtime + age."""
    dst = tmp_path / "out.lmdb"
    lock = lock_path(dst)
    lock.write_text(json.dumps({"host": "node-b", "pid": 4242, "since": "2026-11-25T10:00:00+00:00"}))
    touched = 1_700_000_000
    os.utime(lock, (touched, touched))
    monkeypatch.setattr(datapipe.storage.output_lock, "clock", lambda: touched + age)
    if refused:
        with pytest.raises(ConvertError, match=r"host node-b, pid 4242"):
            convert(IMAGEFOLDER, dst, ConvertOptions(**QUIET))
    else:
        convert(IMAGEFOLDER, dst, ConvertOptions(**QUIET))
        assert dst.exists()


def test_the_lock_is_released_after_a_conversion_and_can_be_held_again(tmp_path):
    dst = tmp_path / "out.lmdb"
    convert(IMAGEFOLDER, dst, ConvertOptions(**QUIET))
    assert not lock_path(dst).exists()
    with writer_lock(dst) as mine:
        assert json.loads(lock_path(dst).read_text())["pid"] == mine["pid"] == os.getpid()
        with pytest.raises(ConvertError, match="another conversion"):  # a second holder in this process too
            with writer_lock(dst):
                pass
    assert not lock_path(dst).exists()


@pytest.mark.parametrize("target", ["victim.txt", "gone/outside.txt"])
def test_a_link_planted_at_the_lock_is_refused_and_nothing_is_written_through_it(tmp_path, target):
    """#38: DST.lock a symlink to a file the user can write (or dangling): one line naming it, saying to
    remove it; the file it points to is neither overwritten nor created."""
    dst, outside = tmp_path / "out" / "data.lmdb", tmp_path / target
    if target == "victim.txt":
        outside.write_text("keep me")
    dst.parent.mkdir()
    lock_path(dst).symlink_to(outside)
    with pytest.raises(ConvertError, match=rf"^{lock_path(dst)} is a symbolic link, not a plain file: .* remove it"):
        convert(IMAGEFOLDER, dst, ConvertOptions(**QUIET))
    assert (outside.read_text() == "keep me") if target == "victim.txt" else not outside.parent.exists()
    assert not outside.parent.exists() or outside.exists() == (target == "victim.txt")
    assert lock_path(dst).is_symlink() and not dst.exists()


def test_a_fifo_planted_at_the_lock_is_refused_without_blocking(tmp_path):
    dst = tmp_path / "data.lmdb"
    os.mkfifo(lock_path(dst))
    with pytest.raises(ConvertError, match=r"data.lmdb.lock is a FIFO, not a plain file"):
        with writer_lock(dst):
            pass


def test_a_link_planted_in_a_resumed_staging_folder_is_not_appended_through(tmp_path):
    """The source log of a resumed LMDB/HDF5 conversion is opened through durable.open_own too."""
    from datapipe.storage.durable import NotOwnFile
    from converters.staging import SOURCES_NAME, SourceLog

    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    (tmp_path / SOURCES_NAME).symlink_to(victim)
    with pytest.raises(NotOwnFile, match=rf"{SOURCES_NAME} is a symbolic link, not a plain file: .* remove it"):
        SourceLog(tmp_path, 0)
    assert victim.read_text() == "keep me"


@pytest.mark.parametrize("offset", [0, 5])
def test_a_link_planted_at_a_shard_of_a_resumed_wds_staging_folder_is_not_written_through(tmp_path, offset):
    """A .wds shard (new, or resumed at `offset`) and its .idx are opened through durable.open_own."""
    from datapipe.storage.durable import NotOwnFile
    from datapipe.formats.wds import ShardFile, shard_name

    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    (tmp_path / shard_name("train", 0)).symlink_to(victim)
    with pytest.raises(NotOwnFile, match=r"is a symbolic link, not a plain file: .* remove it"):
        ShardFile(tmp_path, "train", 0, offset=offset)
    assert victim.read_text() == "keep me"
