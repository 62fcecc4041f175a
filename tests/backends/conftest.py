"""The loader tests run over every source: the packed formats, an image folder, foreign shards."""
import pytest


@pytest.fixture(params=["lmdb", "hdf5", "wds", "folder", "shards"])
def source(request, clean_folder, foreign_shards):
    if request.param == "folder":
        return clean_folder
    if request.param == "shards":
        return foreign_shards
    return request.getfixturevalue("packed_" + request.param)
