"""`kill -9` of a conversion's driver ends its workers too: none idles on, and no `.wds` worker writes
a shard into the staging folder after the driver is gone (the next --resume or --overwrite uses it).
The workers are held at their first task until the driver is dead, so the test never races them."""
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from datapipe.formats import staging_path
from tests.conftest import IMAGEFOLDER
from tests.converters.faults import deadline

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads processes from /proc")
GONE_WITHIN_S = 20  # a bound, not a measure: the workers go at once (the kernel) or within 0.5 s (a watch)

HOLD = """
import os, sys, time
import {module} as target
real, driver = target.{name}, os.getpid()
def held(*args, **kwargs):
    if os.getpid() != driver:  # a worker: say so, then wait for the test to let go
        open(os.path.join({marks!r}, str(os.getpid())), "w").close()
        while not os.path.exists({release!r}):
            time.sleep(0.02)
    return real(*args, **kwargs)
target.{name} = held
{extra}
from datapipe.cli.main import main
sys.exit(main({args!r}))
"""
NO_PDEATHSIG = "import converters.workers as w; w._kernel_kills_orphans = lambda: False"


def children(pid: int) -> set[int]:
    """The processes whose parent is `pid`."""
    out = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid:
                out.add(int(stat.parent.name))
    return out


def alive(pid: int) -> bool:
    """Running (a zombie, dead and not yet reaped by its new parent, is not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_for(condition, what: str) -> None:
    limit = time.monotonic() + GONE_WITHIN_S
    while not condition():
        if time.monotonic() > limit:
            pytest.fail(f"{what} after {GONE_WITHIN_S} s")
        time.sleep(0.05)


def shard_files(staging: Path) -> set[str]:
    return {p.name for p in staging.iterdir() if p.is_file()} if staging.is_dir() else set()


@pytest.mark.parametrize("suffix,watch", [(".lmdb", "kernel"), (".wds", "kernel"), (".wds", "thread")])
def test_workers_die_with_a_killed_driver_and_write_nothing_after_it(tmp_path, suffix, watch):
    marks, release, dst = tmp_path / "workers", tmp_path / "release", tmp_path / f"out{suffix}"
    marks.mkdir()
    module, name = ("converters.engines.local", "build_shard") if suffix == ".wds" else ("converters.pack", "_prepare")
    args = ["convert", str(IMAGEFOLDER), str(dst), "--workers", "2", "--shard-size", "64KiB", "-q"]
    script = HOLD.format(module=module, name=name, marks=str(marks), release=str(release), args=args,
                         extra=NO_PDEATHSIG if watch == "thread" else "")
    driver = subprocess.Popen([sys.executable, "-c", script], start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    workers: set[int] = set()
    try:
        with deadline():
            wait_for(lambda: len(list(marks.iterdir())) == 2 or driver.poll() is not None, "no two workers started")
            assert driver.poll() is None, "the conversion ended before its workers were held"
            workers = children(driver.pid)
            assert {int(p.name) for p in marks.iterdir()} <= workers
            driver.kill()
            driver.wait()
            before = shard_files(staging_path(dst))
            release.touch()  # a worker still there now builds and commits its shard

            with contextlib.suppress(pytest.fail.Exception):
                wait_for(lambda: not any(map(alive, workers)), "workers alive")
            left = sorted(pid for pid in workers if alive(pid))
            written = shard_files(staging_path(dst)) - before
            assert not left and not written, f"workers {left} outlived the driver; they wrote {sorted(written)}"
    finally:
        for pid in workers:  # this test's processes only, whatever happened
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()
