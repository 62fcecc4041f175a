import os
from pathlib import Path

import pytest

from datapipe.formats.scan import detect_layout, make_key, scan_folder, scan_labelled, scan_split_compact


def test_split_layout_classes_from_train_and_val_lacks_a_class(imagefolder):
    layout = scan_folder(imagefolder)
    assert detect_layout(imagefolder) == "splits"
    assert layout.classes.classes == ("cat", "dog", "fish")
    assert set(layout.splits) == {"train", "val"}
    assert {f.label for f in layout.splits["val"]} == {0, 1}  # no fish in val, labels still train's


def test_finds_nested_symlinked_upper_case_and_ignores_other_files(imagefolder):
    paths = {f.relpath for f in scan_folder(imagefolder).splits["train"]}
    assert "train/cat/nested/deeper/nested_000.jpg" in paths
    assert "train/fish/linked/linked_000.jpg" in paths
    assert "train/cat/gray.JPEG" in paths
    assert not any(p.endswith(".txt") for p in paths)


def test_labels_follow_class_folders(imagefolder):
    for f in scan_folder(imagefolder).splits["train"]:
        assert f.label == ["cat", "dog", "fish"].index(f.relpath.split("/")[1])


def test_keys_are_unique_ascii_without_dots():
    taken: set[str] = set()
    keys = [make_key(p, taken) for p in ("a/b.c.jpg", "a/b_c.jpg", "a b/ü.png", "x" * 300 + ".jpg")]
    assert len(set(keys)) == 4
    assert all(k.isascii() and "." not in k and "/" not in k and " " not in k and len(k) <= 80 for k in keys)


def test_class_layout_is_one_split(imagefolder):
    layout = scan_folder(imagefolder / "val", split="holdout")
    assert list(layout.splits) == ["holdout"] and layout.classes.classes == ("cat", "dog")


def test_empty_folder_error_names_the_expected_layout(tmp_path):
    (tmp_path / "cls").mkdir()
    (tmp_path / "cls" / "readme.txt").write_text("x")
    with pytest.raises(ValueError, match=r"Found 0 images .* Supported image extensions"):
        scan_folder(tmp_path)


def test_flat_folder_with_labels_csv(imagefolder, tmp_path):
    flat = tmp_path / "flat"
    flat.mkdir()
    for i, f in enumerate(sorted((imagefolder / "val").rglob("*.jpg"))):
        (flat / f"ILSVRC_val_{i:03d}.JPEG").write_bytes(f.read_bytes())
    (flat / "unlabelled.jpg").write_bytes(b"x")
    csv = tmp_path / "labels.csv"
    csv.write_text("filename,class\nILSVRC_val_000.JPEG,cat\nILSVRC_val_001.JPEG,cat\n"
                   "ILSVRC_val_002.JPEG,dog\nILSVRC_val_003.JPEG,dog\nmissing.JPEG,dog\n")
    layout = scan_labelled(flat, csv)
    assert [f.label for f in layout.splits["val"]] == [0, 0, 1, 1]
    reasons = {s["path"]: s["reason"] for s in layout.skipped["val"]}
    assert "no label" in reasons["unlabelled.jpg"] and "missing" in reasons["missing.JPEG"]


def test_not_a_folder(tmp_path: Path):
    with pytest.raises(ValueError, match="is not a folder"):
        scan_folder(tmp_path / "nope")


def _awkward_folder(root: Path) -> Path:
    """Splits without a train split's class in val, nested and looping symlinked folders, keys that
    collide once sanitised, a name that is not UTF-8, empty classes."""
    for relpath in ("train/b/x.jpg", "train/b/x.png", "train/b/x y.jpg", "train/b/x_y.jpg", "train/a/d/e/f.jpg", "train/a/d e/g.jpg",
                    "train/a/top.jpg", "train/a b/1.jpg", "val/b/v.jpg", "val/zz/unknown.jpg", "test/a/t.jpg"):
        (root / relpath).parent.mkdir(parents=True, exist_ok=True)
        (root / relpath).write_bytes(b"x")
    (root / "train" / "empty").mkdir()
    (root / "train" / "a" / "loop").symlink_to(root / "train" / "a")
    (root / "train" / "b" / "linked").symlink_to(root / "train" / "a" / "d")
    (root / os.fsdecode(b"train/b/caf\xe9.jpg")).write_bytes(b"x")
    return root


@pytest.mark.parametrize("split", ["train", "val", "test"])
def test_the_reader_s_compact_scan_matches_the_converter_s_scan(tmp_path, imagefolder, split):
    """The folder reader scans without the per-file objects; it must see the converter's files,
    order, labels and keys, so a folder and its packed copy agree record for record."""
    for root in (_awkward_folder(tmp_path / "awkward"), imagefolder):
        layout = scan_folder(root)
        if split not in layout.splits:
            continue
        classes, splits, files = scan_split_compact(root, split)
        assert (classes.classes, splits) == (layout.classes.classes, sorted(layout.splits))
        assert list(files) == [(os.fsencode(f.path.relative_to(root)), f.key, f.label) for f in layout.splits[split]]
    for root in (tmp_path / "awkward" / "train", imagefolder / "train"):  # the one-split layout
        classes, _, files = scan_split_compact(root, split)
        layout = scan_folder(root, split=split)
        assert list(files) == [(os.fsencode(f.path.relative_to(root)), f.key, f.label) for f in layout.splits[split]]
