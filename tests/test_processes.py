"""The suite's own deadline for commands that start processes (tests/processes.py): a hang fails with
the stacks and leaves nothing running, a launcher's ranks in sessions of their own included."""
from __future__ import annotations

import sys
import time

import pytest

from tests.processes import deadline, run_in_session

# A launcher (as torchrun does) starts its child in a session of its own; the child keeps the
# launcher's stdout and stderr open and sleeps, writing its pid first.
LAUNCHER = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
print(child.pid, flush=True)
open(sys.argv[1], "w").write(str(child.pid))
time.sleep(600)
"""


def test_a_hang_fails_with_the_stacks_and_kills_a_child_in_a_session_of_its_own(tmp_path):
    pid_file = tmp_path / "child.pid"
    # 10 s: room for two interpreters to start on a loaded machine before the deadline, so that the launcher
    # has written the child's pid and installed faulthandler when the SIGABRT comes
    with deadline(120), pytest.raises(AssertionError, match=r"did not finish in 10 s \(a hang\); the stacks") as caught:
        run_in_session([sys.executable, "-c", LAUNCHER, str(pid_file)], 10)
    assert "time.sleep(600)" in str(caught.value) or "<module>" in str(caught.value)  # faulthandler's stacks
    assert "Extension modules:" not in str(caught.value)
    child = int(pid_file.read_text())
    with deadline(30):
        while True:  # killed by the deadline's clean-up: gone, or a zombie until init reaps it
            try:
                state = open(f"/proc/{child}/stat").read().rsplit(")", 1)[1].split()[0]
            except FileNotFoundError:
                break
            if state == "Z":
                break
            time.sleep(0.05)
