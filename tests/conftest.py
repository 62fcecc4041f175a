"""Shared fixtures: the fixture image folder, and it converted once per format per session."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from converters import ConvertOptions, convert

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
IMAGEFOLDER = FIXTURES / "imagefolder"
SUFFIX = {"lmdb": ".lmdb", "hdf5": ".h5", "wds": ".wds"}
BAD_FILES = {
    "train/cat/truncated.jpg": "truncated",
    "train/dog/empty.jpg": "empty file",
    "train/dog/text.jpg": "not an image",
    "train/fish/bomb.png": "decompression bomb",
}


@pytest.fixture(scope="session")
def imagefolder() -> Path:
    return IMAGEFOLDER


@pytest.fixture(scope="session", params=sorted(SUFFIX))
def packed(request, tmp_path_factory) -> Path:
    """The fixture folder converted to each format (session-wide; tests must not modify it)."""
    dst = tmp_path_factory.mktemp(request.param) / f"fixture{SUFFIX[request.param]}"
    convert(IMAGEFOLDER, dst, ConvertOptions(workers=2, progress=False, shard_bytes=64 << 10))
    return dst


@pytest.fixture
def packed_copy(packed, tmp_path) -> Path:
    """A private copy of a packed dataset that a test may damage."""
    dst = tmp_path / packed.name
    (shutil.copytree if packed.is_dir() else shutil.copy2)(packed, dst)
    return dst
