"""Datasets long enough for bench's loader rows to be throughputs: the fixture's clean images copied
COPIES times (~260 train records), so batch 4 with 1 worker and 1 warm-up batch times 61 batches per
epoch, over the 50 per worker a row needs (datapipe/bench/sanity.py). The runs here go to the epoch's
end (a long --seconds), so the batch counts, unlike the clock, are the same on every machine."""
import shutil

import pytest

from converters import ConvertOptions, convert

COPIES = 10


@pytest.fixture(scope="session")
def long_folder(tmp_path_factory, clean_folder):
    root = tmp_path_factory.mktemp("long") / "images"
    for image in (clean_folder / "train").rglob("*"):
        if image.is_file() and image.suffix.lower() in (".jpg", ".jpeg", ".png"):
            folder = root / "train" / image.relative_to(clean_folder / "train").parts[0]
            folder.mkdir(parents=True, exist_ok=True)
            for k in range(COPIES):
                shutil.copyfile(image, folder / f"{image.stem}_{k}{image.suffix}")
    return root


@pytest.fixture(scope="session")
def long_lmdb(tmp_path_factory, long_folder):
    dst = tmp_path_factory.mktemp("long_lmdb") / "long.lmdb"
    convert(long_folder, dst, ConvertOptions(workers=2, progress=False))
    return dst
