"""Sources for the loader tests: the packed formats, a clean image folder, and foreign shards."""
import shutil

import pytest

from datapipe.scan import scan_folder
from tests.conftest import BAD_FILES, IMAGEFOLDER


@pytest.fixture(scope="session")
def clean_folder(tmp_path_factory):
    """The fixture folder without its bad files (DALI's readers.file decodes whatever it is given)."""
    root = tmp_path_factory.mktemp("clean") / "images"
    shutil.copytree(IMAGEFOLDER, root, symlinks=False)
    for bad in BAD_FILES:
        (root / bad).unlink()
    return root


@pytest.fixture(scope="session")
def foreign_shards(tmp_path_factory):
    """Shards written by the webdataset library itself: .jpg/.png + .cls, no .idx, no manifest."""
    import webdataset as wds

    root = tmp_path_factory.mktemp("foreign")
    files = [f for f in scan_folder(IMAGEFOLDER).splits["train"] if f.relpath not in BAD_FILES
             and f.path.read_bytes()[:3] in (b"\xff\xd8\xff", b"\x89PN")]
    for shard in range(2):
        with wds.TarWriter(str(root / f"foreign-{shard:06d}.tar")) as sink:
            for f in files[shard::2]:
                ext = "jpg" if f.path.read_bytes()[:3] == b"\xff\xd8\xff" else "png"
                sink.write({"__key__": f.key, ext: f.path.read_bytes(), "cls": str(f.label)})
    return str(root / "foreign-{000000..000001}.tar")


@pytest.fixture(params=["lmdb", "hdf5", "wds", "folder", "shards"])
def source(request, tmp_path_factory, clean_folder, foreign_shards):
    if request.param == "folder":
        return clean_folder
    if request.param == "shards":
        return foreign_shards
    return request.getfixturevalue("packed_" + request.param)


def _packed(tmp_path_factory, suffix):
    from converters import ConvertOptions, convert

    dst = tmp_path_factory.mktemp(suffix.strip(".")) / f"loader{suffix}"
    convert(IMAGEFOLDER, dst, ConvertOptions(workers=1, progress=False, shard_bytes=64 << 10))
    return dst


@pytest.fixture(scope="session")
def packed_lmdb(tmp_path_factory):
    return _packed(tmp_path_factory, ".lmdb")


@pytest.fixture(scope="session")
def packed_hdf5(tmp_path_factory):
    return _packed(tmp_path_factory, ".h5")


@pytest.fixture(scope="session")
def packed_wds(tmp_path_factory):
    return _packed(tmp_path_factory, ".wds")
