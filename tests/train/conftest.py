"""Fixtures of the training tests: a tiny learnable dataset."""
import pytest

from converters import ConvertOptions, convert
from tools.make_sample import make


@pytest.fixture(scope="session")
def learnable(tmp_path_factory):
    """3 classes, each made of crops of its own pictures: learnable, with a val split (72 train images)."""
    root = tmp_path_factory.mktemp("learn")
    make(root / "images", per_class=24, size=(64, 48), seed=1, extras=False)
    convert(root / "images", root / "learn.lmdb", ConvertOptions(workers=1, progress=False))
    return str(root / "learn.lmdb")
