"""Fixtures of the training tests: a tiny learnable dataset."""
import pytest

from converters import ConvertOptions, convert
from tools.make_sample import make


def packed_sample(tmp_path_factory, name: str, per_class: int) -> str:
    """tools/make_sample's 3 classes, `per_class` train images each (64 x 48) and a val split, as LMDB."""
    root = tmp_path_factory.mktemp(name)
    make(root / "images", per_class=per_class, size=(64, 48), seed=1, extras=False)
    convert(root / "images", root / f"{name}.lmdb", ConvertOptions(workers=1, progress=False))
    return str(root / f"{name}.lmdb")


@pytest.fixture(scope="session")
def learnable(tmp_path_factory):
    """3 classes, each made of crops of its own pictures: learnable, with a val split (72 train images)."""
    return packed_sample(tmp_path_factory, "learn", 24)
