"""Running a command that starts processes, with a deadline: a hang kills its whole session and fails."""
from __future__ import annotations

import os
import signal
import subprocess


def run_in_session(argv: list[str], timeout: float, *, cwd=None, check: bool = True) -> subprocess.CompletedProcess:
    """Run `argv` as the leader of a new session; on a timeout kill every process it started and fail."""
    process = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        _, stderr = process.communicate()
        raise AssertionError(f"{argv[:3]} did not finish in {timeout} s (a hang): {stderr[-3000:]}") from None
    if check:
        assert process.returncode == 0, stderr[-3000:]
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
