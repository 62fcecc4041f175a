"""Conversions that fail on purpose. Shard builders for the Ray engine's tests live in a module
imported by its package path (tests.converters.faults), so Ray's workers can import them by name;
the preludes kill a local worker process (inherited through fork) for `run_datapipe`, which runs
the command line with a deadline, so a conversion that hangs fails its test instead of the suite."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from converters.shards import build_shard
from tests.processes import deadline as process_deadline

DEADLINE_S = 60  # for one command; a conversion of the fixture folder takes about a second
TEST_DEADLINE_S = 4 * DEADLINE_S  # for a test that runs a few

KILL_MID_SHARD = """
import os, signal
import converters.engines.local as local
build, driver = local.build_shard, os.getpid()
def dying(job, ctx, tick=None):
    if job.name != {shard!r} or os.getpid() == driver:
        return build(job, ctx, tick)
    done = []
    def count_then_die(files, nbytes):
        tick(files, nbytes)
        done.append(files)
        if len(done) == {files}:
            os.kill(os.getpid(), signal.SIGKILL)
    return build(job, ctx, count_then_die)
local.build_shard = dying
"""

KILL_READING = """
import os, signal
import converters.pack as pack
prepare, driver = pack._prepare, os.getpid()
def dying(job):
    if job[0].endswith({name!r}) and os.getpid() != driver:
        os.kill(os.getpid(), signal.SIGKILL)
    return prepare(job)
pack._prepare = dying
"""


def kill_mid_shard(shard: str, files: int) -> str:
    """A prelude: the local worker building `shard` kills itself (SIGKILL, as the OOM killer does)
    after `files` of its files."""
    return KILL_MID_SHARD.format(shard=shard, files=files)


def kill_reading(relpath: str) -> str:
    """A prelude: the LMDB/HDF5 worker about to read the file ending in `relpath` kills itself."""
    return KILL_READING.format(name=relpath)


def run_datapipe(args: list[str], prelude: str = "", timeout: float = DEADLINE_S,
                 **popen) -> subprocess.CompletedProcess:
    """`datapipe <args>` after `prelude`, in a session of its own; past `timeout` seconds the whole
    session (its workers too) is killed and the test fails, saying the command hung."""
    script = f"import sys\n{prelude}\nfrom datapipe.cli.main import main\nsys.exit(main({args!r}))\n"
    proc = subprocess.Popen([sys.executable, "-c", script], start_new_session=True, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"`datapipe {' '.join(args)}` still ran after {timeout} s: it hangs. stderr: {err[-2000:]}")
    finally:  # whatever the command or its workers left running, this test's deadline included
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def deadline(seconds: float = TEST_DEADLINE_S):
    """tests.processes.deadline with this module's default: a test that runs a few conversions."""
    return process_deadline(seconds)


def dies_mid_shard_once(job, ctx, tick=None, *, marker: Path, shard: str):
    """A Ray task that kills its own worker process after 3 files of `shard`, the first time only."""
    if job.name != shard or marker.exists():
        return build_shard(job, ctx, tick)
    marker.write_text(str(os.getpid()))
    done = []

    def die_after_three(files, nbytes):
        done.append(files)
        if len(done) == 3:
            os._exit(1)

    return build_shard(job, ctx, die_after_three)


def always_fails(job, ctx, tick=None, *, attempts: Path):
    with open(attempts, "a") as fh:
        fh.write(f"{job.name}\n")
    raise OSError(28, "No space left on device (injected)")
