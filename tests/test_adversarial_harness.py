"""The adversarial harness (tools/adversarial/) catches what it exists to catch: each kind of break once."""
from __future__ import annotations

import pytest

from tools.adversarial.harness import CANARIES, Case, run_case


@pytest.mark.parametrize("code, expect, verdict", [
    ("import sys; print('refused: give a file'); sys.exit(2)", "refused", "held"),
    ("print('fine')", "ok", "held"),
    ("print('fine')", "refused", "exit"),
    ("import time; time.sleep(60)", "either", "hang"),
    ("raise RuntimeError('boom')", "either", "traceback"),
    ("b = bytearray(2 << 30)", "either", "memory"),
    ("import os; print(os.environ['HF_TOKEN'])", "either", "leak"),
    ("print({k: v for k, v in __import__('os').environ.items()})", "either", "leak"),
    ("print('x' * 5000)", "either", "long-line"),
    ("print('\\x1b]0;owned\\x07\\x1b[2J')", "either", "control-char"),
    ("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)", "either", "killed"),
])
def test_each_break_is_named(code, expect, verdict):
    outcome = run_case(Case("t", code=code, expect=expect, timeout_s=3, mem_mb=1024))
    assert outcome.verdict == verdict, outcome
    assert outcome.held == (verdict == "held")


def test_setup_builds_the_input_in_the_case_folder_and_the_canaries_are_set():
    case = Case("t", code="import os; print(open('{tmp}/in.txt').read(), 'HF_TOKEN' in os.environ)", expect="ok",
                setup=lambda tmp: (tmp / "in.txt").write_text("hello"), timeout_s=10)
    outcome = run_case(case)
    assert outcome.held and outcome.last_line == "hello True", outcome
    assert len(CANARIES) >= 5


def test_a_case_gives_argv_or_code():
    with pytest.raises(ValueError, match="give argv or code"):
        Case("t")
