"""`@pytest.mark.forked`: the test's body runs in a child forked from the pytest worker, where the
calling thread is the only thread. For the tests that measure with tracemalloc: on Python 3.11 its
stop() races any other thread allocating at that moment (CPython gh-128679, fixed in 3.12 and 3.13
only), and a pytest worker carries threads earlier tests left (a shard cache's prefetch pool, tqdm's
monitor, an in-process Ray): the worker died of a SIGSEGV in libpython under `make test`. Fixtures are
set up and torn down in the worker; the child reports a failure or a skip back through a pipe."""
from __future__ import annotations

import os
import select
import signal
import time
import traceback

import pytest

SKIP, FAIL = b"S", b"F"
DEADLINE_S = 600  # a child still running then hangs: killed, and the test fails


def _read_until_eof(fd: int, pid: int) -> bytes:
    """The child's report (everything until it closes the pipe); past DEADLINE_S the child is killed."""
    chunks, end = [], time.monotonic() + DEADLINE_S
    with os.fdopen(fd, "rb", buffering=0) as pipe:
        while True:
            ready, _, _ = select.select([pipe], [], [], max(0.0, end - time.monotonic()))
            if not ready:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                pytest.fail(f"the forked test was still running after {DEADLINE_S} s: killed (a hang)", pytrace=False)
            chunk = pipe.read(1 << 16)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)


def run_forked(item: pytest.Function) -> None:
    """Call the test function of `item` in a forked child; re-raise its failure or skip here."""
    kwargs = {name: item.funcargs[name] for name in item._fixtureinfo.argnames}
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: run, report, leave without running the worker's exit handlers
        os.close(read)
        code, report = 0, b""
        try:
            item.obj(**kwargs)
        except BaseException as exc:  # noqa: BLE001 (a failure, a skip, anything: reported)
            code = 1
            kind = SKIP if isinstance(exc, pytest.skip.Exception) else FAIL
            text = str(exc) if kind == SKIP else "".join(traceback.format_exception(exc))
            report = kind + text.encode(errors="replace")
        with os.fdopen(write, "wb") as out:
            out.write(report)
        os._exit(code)
    os.close(write)
    report = _read_until_eof(read, pid)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        pytest.fail(f"the forked test died of {signal.Signals(os.WTERMSIG(status)).name}", pytrace=False)
    if report.startswith(SKIP):
        pytest.skip(report[1:].decode())
    if report.startswith(FAIL) or os.WEXITSTATUS(status):
        pytest.fail(f"in the forked child:\n{report[1:].decode()}", pytrace=False)
