"""The shared folder index (`<cache>/index/folder-<digest>/`) is read only when what it holds is what
its name says (issue #34, finding 4): one planted there with wrong labels, damaged or cut short is
rebuilt from the scan, and a worker sent the path of one changed since refuses it."""
from __future__ import annotations

import logging
import os
import pickle

import numpy as np
import pytest

from datapipe.formats.folder import FolderDataset


def plant(folder, how: str) -> None:
    """Replace the index's labels as another writer would: a new file renamed over the old one."""
    labels = folder / "labels.npy"
    tmp = folder / "planted.npy"
    if how == "every label 0":
        np.save(tmp, np.zeros_like(np.load(labels)))
    elif how == "the same bytes as int16":  # twice as many labels, from the same bytes
        np.save(tmp, np.load(labels).view(np.int16))
    elif how == "not an array":
        tmp.write_bytes(b"junk")
    else:
        labels.unlink()
        return
    os.replace(tmp, labels)


def labels_of(ds) -> list[int]:
    return [ds.index.label(i) for i in range(len(ds))]


@pytest.mark.parametrize("how", ["every label 0", "the same bytes as int16", "not an array", "missing"])
def test_a_planted_folder_index_is_rebuilt_from_the_scan_never_read(clean_folder, tmp_path, caplog, how):
    truth = FolderDataset(clean_folder, cache_dir=tmp_path / "cache")
    labels, folder = labels_of(truth), truth.index.folder
    assert len(set(labels)) > 1
    plant(folder, how)
    with caplog.at_level(logging.WARNING):
        again = FolderDataset(clean_folder, cache_dir=tmp_path / "cache")
    assert labels_of(again) == labels and again.index.folder == folder
    assert f"the folder index {folder}" in caplog.text and "rebuilt from the scan" in caplog.text
    assert np.load(folder / "labels.npy").tolist() == labels  # the folder holds the listing again


def test_a_worker_refuses_an_index_changed_after_the_dataset_was_opened(clean_folder, tmp_path):
    ds = FolderDataset(clean_folder, cache_dir=tmp_path / "cache")
    blob = pickle.dumps(ds)
    assert len(blob) < 4096  # still the path, not the records
    assert labels_of(pickle.loads(blob)) == labels_of(ds)
    plant(ds.index.folder, "every label 0")
    with pytest.raises(ValueError, match=r"the folder index .* does not hold the listing it was made from .* after "
                                         r"the dataset was opened; open the dataset again"):
        pickle.loads(blob)
