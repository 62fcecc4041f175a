"""Fixtures shared by the converter tests."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conftest import IMAGEFOLDER


@pytest.fixture
def source(tmp_path) -> Path:
    """A copy of the fixture folder (symlinked folders copied whole), for a test to change."""
    root = tmp_path / "src"
    shutil.copytree(IMAGEFOLDER, root)
    return root
