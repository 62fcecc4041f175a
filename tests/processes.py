"""Deadlines for tests that could hang: a command that starts processes (a hang kills its whole
session and fails), and code run in this process (SIGALRM raises TimeoutError in the main thread)."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Raise TimeoutError in this process's main thread past `seconds`; forked children do not
    inherit the timer."""
    def expired(signum, frame):
        raise TimeoutError(f"still running after {seconds} s: it hangs")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def descendants(pid: int) -> list[int]:
    """Every living process below `pid`, children first (from /proc; a launcher such as torchrun starts
    its ranks in sessions of their own, which a signal to the session leader's group misses)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def signal_all(pids: list[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


def run_in_session(argv: list[str], timeout: float, *, cwd=None, check: bool = True,
                   env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run `argv` as the leader of a new session; on a timeout fail with where every Python process it
    started stood (faulthandler's stacks, dumped on SIGABRT), then kill them all, those in sessions of
    their own too."""
    # Unbuffered stdio: a process forked while another thread of its parent holds stderr's buffer lock
    # inherits it held and waits on it for good (CPython gh-84579, open); raw stdio has no such lock.
    # An Accelerate rank forked by notebook_launcher once stood so in faulthandler.enable's flush.
    env = {**(os.environ if env is None else env), "PYTHONFAULTHANDLER": "1", "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True, env=env)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        tree = [process.pid, *descendants(process.pid)]  # before any dies and its children move to init
        signal_all(tree[::-1], signal.SIGABRT)  # each Python process prints its threads' stacks, ranks first
        try:
            _, stderr = process.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        signal_all(tree, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        try:
            _, stderr = process.communicate(timeout=30)  # everything it printed, the stacks included
        except subprocess.TimeoutExpired:
            stderr = "(its output's pipes are still held open by a process not found)"
        stacks = "\n".join(line for line in (stderr or "").splitlines() if not line.startswith("Extension modules:"))
        raise AssertionError(f"{argv[:3]} did not finish in {timeout} s (a hang); the stacks: {stacks[-12000:]}") from None
    if check:
        assert process.returncode == 0, stderr[-3000:]
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


@contextlib.contextmanager
def holding(code: str, *args: str, cwd=None) -> Iterator[subprocess.Popen]:
    """A real second process running `code` (python -c) with `args`, which prints "held" once it holds
    what it takes and keeps it until this context ends (then it is killed)."""
    import sys

    proc = subprocess.Popen([sys.executable, "-c", code, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, cwd=cwd)
    try:
        import select

        ready, _, _ = select.select([proc.stdout], [], [], 60)
        assert ready, "the holding process said nothing in 60 s"
        assert proc.stdout.readline().strip() == "held"
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=30)
