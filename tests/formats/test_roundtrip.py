"""Every format gives back exactly what the converter stored: bytes, labels, classes, skip report."""
import io
import pickle

import numpy as np
import pytest
import torch
from PIL import Image

from datapipe import open_dataset, read_manifest
from datapipe.image.decode import check_image, to_rgb
from datapipe.formats.inspect import verify
from datapipe.records import record_digest
from datapipe.formats.scan import scan_folder
from tests.conftest import BAD_FILES, IMAGEFOLDER

CLASSES = ["cat", "dog", "fish"]


def expected_records(split):
    """relpath -> (stored bytes the converter must produce, label), for the good files of a split."""
    out = {}
    for f in scan_folder(IMAGEFOLDER).splits[split]:
        if f.relpath not in BAD_FILES:
            out[f.relpath] = (check_image(f.path.read_bytes()).data, f.label)
    return out


@pytest.mark.parametrize("split", ["train", "val"])
def test_every_good_file_round_trips_byte_exact_once(packed, split):
    ds = open_dataset(packed, split)
    want = expected_records(split)
    got = [ds.record(i) for i in range(len(ds))]
    assert sorted(r.path for r in got) == sorted(want)  # each exactly once
    for r in got:
        data, label = want[r.path]
        assert r.data == data and r.label == label
        assert ds[got.index(r)] == (r.key, data, label)
        assert r.sha256 == record_digest(r.key, r.label, r.data)


def test_plain_files_are_the_original_bytes(packed):
    ds = open_dataset(packed, "train")
    by_path = {ds.record(i).path: ds.record(i).data for i in range(len(ds))}
    for name in ("train/cat/cat_000.jpg", "train/cat/gray.JPEG", "train/fish/linked/linked_001.jpg"):
        assert by_path[name] == (IMAGEFOLDER / name).read_bytes()


def test_awkward_files_are_stored_as_originals_or_pngs_of_the_rgb_rule(packed):
    ds = open_dataset(packed, "train")
    by_path = {ds.record(i).path: ds.record(i).data for i in range(len(ds))}
    for name in ("train/cat/cmyk.jpg", "train/cat/exif_rotated.jpg", "train/dog/rgba.png", "train/dog/palette.png"):
        assert by_path[name] == (IMAGEFOLDER / name).read_bytes()  # the backends apply the rule
    stored = np.asarray(Image.open(io.BytesIO(by_path["train/dog/gray16.png"])))
    assert np.array_equal(stored, np.asarray(to_rgb(Image.open(IMAGEFOLDER / "train/dog/gray16.png"))))


def test_classes_labels_and_skip_report(packed):
    manifest = read_manifest(packed)
    assert manifest.classes == CLASSES and open_dataset(packed, "val").classes == CLASSES
    assert {s["path"]: s["reason"] for s in manifest.splits["train"].skipped}.keys() == BAD_FILES.keys()
    for s in manifest.splits["train"].skipped:
        assert BAD_FILES[s["path"]] in s["reason"]
    assert manifest.errors == 4 and manifest.splits["val"].skipped == []
    assert {open_dataset(packed, "val")[i].label for i in range(4)} == {0, 1}


def test_verify_passes_on_intact_output(packed):
    report = verify(packed, progress=False)
    assert report.ok and report.records == 31


def test_unknown_split_and_index_errors(packed):
    with pytest.raises(ValueError, match=r"split 'test' not in this dataset; it has 2 splits: 'train', 'val'"):
        open_dataset(packed, "test")
    with pytest.raises(IndexError, match="out of range"):
        open_dataset(packed, "val")[4]
    assert open_dataset(packed, "val")[-1] == open_dataset(packed, "val")[3]


def _read_all(ds):
    return [ds[i].data for i in range(len(ds))]


def test_opened_dataset_is_safe_in_forked_dataloader_workers(packed):
    ds = open_dataset(packed, "train")
    first = ds[0]  # opens the store in the parent before the fork
    pickle.dumps(ds)  # no environment or file handle is pickled
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2, collate_fn=lambda s: s,
                                         multiprocessing_context="fork")
    got = [s.data for s in loader]
    assert got == _read_all(ds) and got[0] == first.data
