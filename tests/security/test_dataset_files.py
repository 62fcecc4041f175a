"""Files that come with a dataset are read one safe way (datapipe.storage.dataset_files, #38 row 3): a caption
or metadata sidecar that links out of the dataset, is a FIFO or a device, or is over the size bound
skips its image with a reason naming it (never read, never hanging, never stored); a manifest that is
a FIFO or a link to /dev/zero is one line."""
from __future__ import annotations

import os
import shutil

import pytest

import datapipe.formats.base
from converters import ConvertOptions, convert
from datapipe import open_dataset
from datapipe.storage.dataset_files import SIDECAR_MAX_BYTES, BadDatasetFile, read_dataset_file
from datapipe.formats.folder import FolderDataset
from datapipe.formats.scan import scan_folder
from tests.conftest import IMAGEFOLDER
from tests.processes import deadline

SECRET = "aws_secret_access_key = not-for-captions"


@pytest.fixture
def folder(tmp_path):
    """tmp_path/ds: the fixture image folder (cat, dog) with a caption beside dog's first image; a
    "credentials" file outside it."""
    root = tmp_path / "ds"
    shutil.copytree(IMAGEFOLDER, root)
    first = sorted((root / "train" / "dog").glob("*.jpg"))[0]
    first.with_suffix(".txt").write_text("a dog\n")
    (tmp_path / "credentials").write_text(SECRET)
    return root


def cat_image(root):
    return sorted((root / "train" / "cat").glob("*.jpg"))[0]


def skipped(root) -> dict[str, str]:
    layout = scan_folder(root)
    return {s["path"]: s["reason"] for entries in layout.skipped.values() for s in entries}


def test_a_caption_linking_out_of_the_dataset_is_never_read_or_stored(folder, tmp_path):
    image = cat_image(folder)
    image.with_suffix(".txt").symlink_to(tmp_path / "credentials")
    dst = tmp_path / "out.wds"
    report = convert(folder, dst, ConvertOptions(progress=False, workers=1))
    reasons = {s["path"]: s["reason"] for info in report.splits.values() for s in info.skipped}
    shown = image.relative_to(folder).as_posix()
    assert shown in reasons
    assert reasons[shown].startswith(f"caption {shown[:-4]}.txt is a link to {tmp_path / 'credentials'}, outside "
                                     "the dataset"), reasons
    assert not any(SECRET.encode() in p.read_bytes() for p in dst.rglob("*") if p.is_file())
    ds = open_dataset(dst, "train")
    assert sorted(ds.record(i).fields.text for i in range(len(ds)) if ds.record(i).fields.text) == ["a dog"]


def test_a_link_to_dev_zero_is_refused_without_reading_it(folder):
    image = cat_image(folder)
    image.with_suffix(".json").symlink_to("/dev/zero")
    reason = skipped(folder)[image.relative_to(folder).as_posix()]
    assert reason.startswith("metadata train/cat/") and "is a link to /dev/zero, outside the dataset" in reason


def test_a_fifo_sidecar_is_refused_without_blocking(folder):
    image = cat_image(folder)
    os.mkfifo(image.with_suffix(".txt"))
    with deadline(20):  # its TimeoutError is an OSError: a blocked read became "cannot be read (...)" before
        reason = skipped(folder)[image.relative_to(folder).as_posix()]
    ds = FolderDataset(folder, "train")  # read in place: that record fails, naming the sidecar
    at = [ds.origin(i) for i in range(len(ds))].index(image.relative_to(folder).as_posix())
    with deadline(20), pytest.raises(ValueError, match=r"^caption train/cat/.*\.txt is a FIFO, not a regular file"):
        ds.record(at)
    assert reason.endswith("is a FIFO, not a regular file; a sidecar must be a file: replace it with one, or remove it")
    assert ds[at].data == image.read_bytes()  # the image itself is still served


def test_a_sidecar_over_the_bound_is_refused_naming_its_size(folder):
    image = cat_image(folder)
    with open(image.with_suffix(".txt"), "wb") as fh:
        fh.truncate(SIDECAR_MAX_BYTES + 1)  # sparse: no memory, no disk
    reason = skipped(folder)[image.relative_to(folder).as_posix()]
    assert f"is {SIDECAR_MAX_BYTES + 1:,} bytes, over the {SIDECAR_MAX_BYTES:,} a sidecar may hold" in reason


def test_links_that_stay_inside_the_dataset_are_followed(folder, tmp_path):
    """A caption linking to another file of the dataset, and a class folder that is itself a link (the
    scan follows folder links): read as before."""
    (folder / "captions").mkdir()
    (folder / "captions" / "c.txt").write_text("shared caption")
    image = cat_image(folder)
    image.with_suffix(".txt").symlink_to(folder / "captions" / "c.txt")
    elsewhere = tmp_path / "elsewhere" / "dog"
    shutil.move(folder / "train" / "dog", elsewhere)
    (folder / "train" / "dog").symlink_to(elsewhere)
    layout = scan_folder(folder)
    texts = {f.relpath: f.fields.text for f in layout.splits["train"] if f.fields.text}
    assert not any(layout.skipped.values())
    assert sorted(texts.values()) == ["a dog", "shared caption"]


@pytest.mark.parametrize("plant", ["fifo", "dev-zero", "too-big"])
def test_a_manifest_that_is_not_a_bounded_regular_file_is_one_line(packed_wds, tmp_path, monkeypatch, plant):
    folder = tmp_path / "ds.wds"
    shutil.copytree(packed_wds, folder)
    manifest = folder / "manifest.json"
    expected = {"fifo": "is a FIFO, not a regular file", "dev-zero": "is a character device, not a regular file",
                "too-big": r"is [\d,]+ bytes, over the 100 a manifest may hold"}[plant]
    if plant == "too-big":
        monkeypatch.setattr(datapipe.formats.base, "MANIFEST_MAX_BYTES", 100)
    else:
        manifest.unlink()
        os.mkfifo(manifest) if plant == "fifo" else manifest.symlink_to("/dev/zero")
    with deadline(20), pytest.raises(BadDatasetFile, match=rf"^{manifest} {expected}") as refused:
        open_dataset(folder, "train")
    assert len(str(refused.value).splitlines()) == 1


def test_a_missing_file_is_none_and_a_socket_is_refused(tmp_path):
    import socket

    assert read_dataset_file(str(tmp_path / "none.txt"), limit=10, what="sidecar") is None
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(tmp_path / "s.txt"))
        with pytest.raises(BadDatasetFile, match="is a socket"):
            read_dataset_file(str(tmp_path / "s.txt"), limit=10, what="sidecar")
