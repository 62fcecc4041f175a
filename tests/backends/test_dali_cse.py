"""DALI's common-subexpression elimination stays off for the recipe graphs (it breaks the op slots'
conditionals on DALI 2.4's GPU operators: benchmarks/gpu-h100-session18), unless the user chose."""
import os

import pytest

from datapipe.augment.dali_kernels import modules


@pytest.fixture
def no_cse_setting(monkeypatch):
    monkeypatch.delenv("DALI_ENABLE_CSE", raising=False)


def test_the_op_kernels_turn_cse_off_before_importing_dali(no_cse_setting):
    pytest.importorskip("nvidia.dali")
    modules()
    assert os.environ["DALI_ENABLE_CSE"] == "0"


def test_the_dali_backend_turns_cse_off(no_cse_setting):
    pytest.importorskip("nvidia.dali")
    from datapipe.backends.dali import require_dali

    require_dali()
    assert os.environ["DALI_ENABLE_CSE"] == "0"


def test_a_users_own_setting_is_kept(monkeypatch):
    pytest.importorskip("nvidia.dali")
    monkeypatch.setenv("DALI_ENABLE_CSE", "1")
    modules()
    assert os.environ["DALI_ENABLE_CSE"] == "1"
