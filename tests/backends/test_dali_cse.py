"""DALI's common-subexpression elimination stays off for the recipe graphs (it breaks the op slots'
conditionals on DALI 2.4's GPU operators: benchmarks/gpu-h100-session18), unless the user chose; the
switch is set once, when the graph side is imported, never by code a graph function runs (AutoGraph
traces that code, and its warning about os.environ printed the environment: tests/security/test_secrets_dali.py)."""
import os
import subprocess
import sys

import pytest

from datapipe.augment.dali_kernels import modules


def cse_after_import(module: str, setting: str | None) -> str:
    """DALI_ENABLE_CSE in a fresh process after `import module`, the user's `setting` (None: unset) before."""
    env = {k: v for k, v in os.environ.items() if k != "DALI_ENABLE_CSE"}
    if setting is not None:
        env["DALI_ENABLE_CSE"] = setting
    code = f"import os, {module}; print(os.environ.get('DALI_ENABLE_CSE'))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


@pytest.mark.parametrize("module", ["datapipe.backends.dali", "datapipe.doctor.selftest.recipe_ops"])
def test_the_graph_builders_turn_cse_off_at_import(module):
    pytest.importorskip("nvidia.dali")
    assert cse_after_import(module, None) == "0"


def test_a_users_own_setting_is_kept():
    pytest.importorskip("nvidia.dali")
    assert cse_after_import("datapipe.backends.dali", "1") == "1"


def test_the_kernels_modules_touch_no_environment(monkeypatch):
    """modules() runs inside graph functions: it imports DALI and nothing else."""
    pytest.importorskip("nvidia.dali")
    monkeypatch.delenv("DALI_ENABLE_CSE", raising=False)
    before = dict(os.environ)
    modules()
    assert dict(os.environ) == before
