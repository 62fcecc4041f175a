"""tests/forked.py: a forked test's failure, skip and crash reach the worker; its pass leaves nothing."""
import os
import signal
import threading
from types import SimpleNamespace

import pytest

from tests.forked import run_forked


def item(fn, **funcargs) -> SimpleNamespace:
    return SimpleNamespace(obj=fn, funcargs=funcargs, _fixtureinfo=SimpleNamespace(argnames=tuple(funcargs)))


def test_the_body_runs_in_a_child_whose_only_thread_is_the_caller():
    started = threading.Event()
    helper = threading.Thread(target=started.wait, daemon=True)  # a thread the worker carries
    helper.start()
    try:
        def body(parent):
            assert os.getpid() != parent and threading.active_count() == 1
        run_forked(item(body, parent=os.getpid()))
    finally:
        started.set()


def test_a_failure_in_the_child_fails_here_with_its_traceback():
    def body():
        assert 1 + 1 == 3, "arithmetic"
    with pytest.raises(pytest.fail.Exception, match=r"(?s)in the forked child:.*AssertionError: arithmetic"):
        run_forked(item(body))


def test_a_skip_in_the_child_skips_here():
    with pytest.raises(pytest.skip.Exception, match="no region decoder"):
        run_forked(item(lambda: pytest.skip("no region decoder")))


def test_a_child_killed_by_a_signal_fails_naming_it():
    with pytest.raises(pytest.fail.Exception, match="died of SIGSEGV"):
        run_forked(item(lambda: os.kill(os.getpid(), signal.SIGSEGV)))


def test_a_child_that_hangs_is_killed_at_the_deadline(monkeypatch):
    import tests.forked as forked

    monkeypatch.setattr(forked, "DEADLINE_S", 0.5)
    with pytest.raises(pytest.fail.Exception, match="still running after 0.5 s: killed"):
        run_forked(item(lambda: signal.pause()))
