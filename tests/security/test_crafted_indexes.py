"""A dataset's offsets file comes from its author: numpy allocates what a `.npy` header claims before
it reads a byte, so the header is checked against the manifest and the file's real size first."""
from __future__ import annotations

import shutil

import numpy as np
import pytest

from datapipe import open_dataset, read_manifest


def _offsets(dataset) -> tuple:
    info = read_manifest(dataset).splits["train"]
    return dataset / info.index["name"], info.samples


@pytest.mark.parametrize("claim", ["billion", "wrong-dtype", "short"])
def test_an_offsets_header_that_does_not_match_the_file_is_refused_in_one_line(packed_wds, tmp_path, claim):
    dataset = tmp_path / packed_wds.name
    shutil.copytree(packed_wds, dataset)
    path, samples = _offsets(dataset)
    real = np.load(path)
    header = {"descr": "<i8", "fortran_order": False, "shape": (samples,)}
    if claim == "billion":
        header["shape"] = (10 ** 15,)  # 8 PB: numpy's read would ask for it at once
    elif claim == "wrong-dtype":
        header["descr"] = "<i4"
    with open(path, "wb") as fh:
        np.lib.format.write_array_header_1_0(fh, header)
        fh.write(real.tobytes()[: -8 if claim == "short" else None])
    with pytest.raises(ValueError, match=rf"^{path}: its header describes .* not the {samples:,} offsets the "
                                         r"manifest's shards hold; the dataset is damaged or was crafted$"):
        open_dataset(dataset)


def test_the_offsets_file_of_a_sound_dataset_passes_the_check(packed_wds):
    path, samples = _offsets(packed_wds)
    assert len(open_dataset(packed_wds)) == samples == len(np.load(path))
