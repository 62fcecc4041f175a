"""Run `datapipe convert` in a child that stops itself (SIGSTOP) at a chosen point, then kill it: the
test waits for the stop, not for a time, so it never races a conversion that finishes first."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile

AFTER_SHARDS = """
import os, signal, sys
from converters.engines import {module}
run = {module}.{engine}.run
def stopping(self, jobs, ctx, tick):
    for n, records in enumerate(run(self, jobs, ctx, tick), 1):
        yield records
        if n == {shards}:  # the whole group: a local Ray's workers stop building shards too
            os.killpg(0, signal.SIGSTOP)
{module}.{engine}.run = stopping
"""

AFTER_CHECKPOINT = """
import os, signal, sys
from converters.staging import Progress
save = Progress.save
def checkpoint(self, staging):
    save(self, staging)
    if self.done >= {files}:
        os.kill(os.getpid(), signal.SIGSTOP)
Progress.save = checkpoint
"""


def kill_convert_when_stopped(args: list[str], prelude: str, env: dict[str, str] | None = None) -> None:
    """Run `datapipe <args>` after `prelude` (one of the above, formatted), wait for its stop, kill
    its whole process group (workers, a local Ray included)."""
    script = prelude + f"from datapipe.cli.main import main; sys.exit(main({args!r}))\n"
    with tempfile.TemporaryFile("w+") as errors:
        proc = subprocess.Popen([sys.executable, "-c", script], start_new_session=True, env=env,
                                stdout=subprocess.DEVNULL, stderr=errors)
        _, status = os.waitpid(proc.pid, os.WUNTRACED)
        errors.seek(0)
        assert os.WIFSTOPPED(status), f"the conversion ended before its stop point (status {status}): {errors.read()}"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def after_shards(shards: int, engine: str = "local") -> str:
    """Stop once the driver has received `shards` finished shards from the engine."""
    module, cls = ("local", "LocalEngine") if engine == "local" else ("ray", "RayEngine")
    return AFTER_SHARDS.format(module=module, engine=cls, shards=shards)


def after_checkpoint(files: int) -> str:
    """Stop at the first LMDB/HDF5 checkpoint past `files` files."""
    return AFTER_CHECKPOINT.format(files=files)
