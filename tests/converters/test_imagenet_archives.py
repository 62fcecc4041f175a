"""`datapipe convert imagenet/ out.X` from ImageNet's downloaded archives (and Kaggle's layout), on
small synthetic archives of the exact layout: a tar of per-class tars, a flat val tar, a devkit
.tar.gz whose meta.mat scipy writes (the reader is ours: converters.matfile)."""
from __future__ import annotations

import gzip
import io
import os
import re
import shutil
import struct
import tarfile
import tempfile
import zlib
from pathlib import Path

import numpy as np
import pytest
import scipy.io
from PIL import Image

from converters import ConvertError, ConvertOptions, convert, list_tasks
from converters.matfile import read_mat
from converters.inputs import read_input
from converters.members import ArchiveMember
from datapipe import open_dataset, read_manifest
from datapipe.cli.main import main
from datapipe.image.headers import BadImageError
from datapipe.formats.inspect import verify
from tests.converters.stopping import after_checkpoint, after_shards, kill_convert_when_stopped
from tests.storage.test_convert_remote import same_dataset_files

WNIDS = ["n01440764", "n01443537", "n01484850"]
ILSVRC_IDS = {1: "n01484850", 2: "n01440764", 3: "n01443537", 4: "n00001740"}  # 4: not a leaf
VAL_IDS = [2, 1, 3, 1, 2, 3]  # the ground truth, line i for ILSVRC2012_val_0000000i
BAD = "ILSVRC2012_img_train.tar:n01443537.tar:n01443537_99.JPEG"
DEVKIT_DATA = "ILSVRC2012_devkit_t12/data/"
OPTIONS = dict(progress=False, workers=2, shard_bytes=64 << 10, checkpoint_every=4)
SUFFIXES = [".lmdb", ".h5", ".wds"]


def jpeg(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 255, (96, 96, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=90)
    return out.getvalue()


def tar_of(members: list[tuple[str, bytes]]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def meta_mat(compress: bool = True) -> bytes:
    fields = ["ILSVRC2012_ID", "WNID", "words", "gloss", "num_children", "children", "wordnet_height",
              "num_train_images"]
    synsets = np.zeros((len(ILSVRC_IDS), 1), dtype=[(f, "O") for f in fields])
    for row, (number, wnid) in enumerate(ILSVRC_IDS.items()):
        leaf = number <= 3
        children = np.zeros((1, 0)) if leaf else np.array([[1.0, 2.0, 3.0]])
        synsets[row, 0] = (np.array([[number]], float), wnid, f"words {wnid}", "a gloss, ü",
                           np.array([[0 if leaf else 3]], float), children, np.array([[0.0]]), np.array([[4.0]]))
    out = io.BytesIO()
    scipy.io.savemat(out, {"synsets": synsets}, do_compression=compress)
    return out.getvalue()


def devkit(ground_truth: list[int] = VAL_IDS, *, meta: bool = True) -> bytes:
    truth = "".join(f"{g}\n" for g in ground_truth).encode()
    members = [(DEVKIT_DATA + "ILSVRC2012_validation_ground_truth.txt", truth)]
    return gzip.compress(tar_of(members + ([(DEVKIT_DATA + "meta.mat", meta_mat())] if meta else [])))


def solution_csv() -> str:
    rows = [f"ILSVRC2012_val_{i:08d},{ILSVRC_IDS[g]} 10 20 30 40 {ILSVRC_IDS[g]} 1 2 3 4"
            for i, g in reversed(list(enumerate(VAL_IDS, 1)))]
    return "ImageId,PredictionString\n" + "\n".join(rows) + "\n"


def expected() -> dict[str, dict[str, tuple[bytes, int]]]:
    """split -> key -> (bytes, label): the keys and labels torchvision's extracted folders would give."""
    train = {f"{w}_{w}_{n}": (jpeg(10 * c + n), c) for c, w in enumerate(WNIDS) for n in range(4)}
    val = {f"{ILSVRC_IDS[g]}_ILSVRC2012_val_{i:08d}": (jpeg(100 + i), WNIDS.index(ILSVRC_IDS[g]))
           for i, g in enumerate(VAL_IDS, 1)}
    return {"train": train, "val": val}


def class_tar(c: int, wnid: str) -> bytes:
    members = [(f"{wnid}_{n}.JPEG", jpeg(10 * c + n)) for n in (3, 1, 0, 2)]  # not in name order
    if c == 1:
        members.append((f"{wnid}_99.JPEG", jpeg(99)[:600]))  # cut short: a bad file
    if c == 2:
        members.append(("README.txt", b"not an image"))  # ignored, as in a folder
    return tar_of(members)


def write_archives(root: Path, *, train: bool = True, val: bool = True) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    if train:
        classes = [(f"{w}.tar", class_tar(c, w)) for c, w in enumerate(WNIDS)]
        (root / "ILSVRC2012_img_train.tar").write_bytes(tar_of(classes))
    if val:
        (root / "ILSVRC2012_img_val.tar").write_bytes(
            tar_of([(f"ILSVRC2012_val_{i:08d}.JPEG", jpeg(100 + i)) for i in (4, 1, 6, 2, 5, 3)]))
    return root


@pytest.fixture(scope="module")
def download(tmp_path_factory) -> Path:
    root = write_archives(tmp_path_factory.mktemp("dl") / "imagenet")
    (root / "ILSVRC2012_devkit_t12.tar.gz").write_bytes(devkit())
    return root


def contents(path: Path) -> dict[str, dict[str, tuple[bytes, int]]]:
    out = {}
    for split in read_manifest(path).splits:
        ds = open_dataset(path, split)
        out[split] = {s.key: (s.data, s.label) for s in (ds[i] for i in range(len(ds)))}
    return out


def image_files(*folders: Path) -> list[Path]:
    return [p for f in folders for p in f.rglob("*") if p.is_file() and p.read_bytes()[:3] == b"\xff\xd8\xff"]


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_every_image_round_trips_byte_exact_with_its_label_and_nothing_is_extracted(download, tmp_path, suffix,
                                                                                  monkeypatch):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    dst = tmp_path / f"out{suffix}"
    report = convert(download, dst, ConvertOptions(**OPTIONS))
    assert contents(dst) == expected()
    manifest = read_manifest(dst)
    assert manifest.classes == WNIDS and report.processed == 13 + 6
    assert [s["path"] for s in manifest.splits["train"].skipped] == [BAD]  # README.txt is no image: not listed
    assert manifest.splits["val"].skipped == []
    assert all(re.fullmatch(r"[A-Za-z0-9_-]+", key) for split in contents(dst).values() for key in split)
    assert verify(dst, progress=False).ok
    assert image_files(scratch, dst if dst.is_dir() else tmp_path) == []  # shards hold images inside tars only
    with pytest.raises(ConvertError, match="already exists; pass --overwrite"):
        convert(download, dst, ConvertOptions(**OPTIONS))


def test_the_dataset_is_the_one_converted_from_the_extracted_folders(download, tmp_path):
    """Same classes, keys, order, labels, bytes and digests as `convert` of train/WNID/*, val/WNID/*."""
    folder = tmp_path / "extracted"
    with tarfile.open(download / "ILSVRC2012_img_train.tar") as outer:
        for member in outer:
            with tarfile.open(fileobj=outer.extractfile(member)) as inner:
                inner.extractall(folder / "train" / member.name[:-4], filter="data")
    with tarfile.open(download / "ILSVRC2012_img_val.tar") as val:
        for member in val:
            wnid = ILSVRC_IDS[VAL_IDS[int(member.name[15:23]) - 1]]
            (folder / "val" / wnid).mkdir(parents=True, exist_ok=True)
            (folder / "val" / wnid / member.name).write_bytes(val.extractfile(member).read())
    convert(download, tmp_path / "archives.lmdb", ConvertOptions(**OPTIONS))
    convert(folder, tmp_path / "folders.lmdb", ConvertOptions(**OPTIONS))
    a, b = read_manifest(tmp_path / "archives.lmdb"), read_manifest(tmp_path / "folders.lmdb")
    assert a.classes == b.classes
    for split in ("train", "val"):
        assert (a.splits[split].samples, a.splits[split].digest) == (b.splits[split].samples, b.splits[split].digest)
    for split in ("train", "val"):
        x, y = open_dataset(tmp_path / "archives.lmdb", split), open_dataset(tmp_path / "folders.lmdb", split)
        assert [x[i] for i in range(len(x))] == [y[i] for i in range(len(y))]


@pytest.mark.parametrize("layout", ["val tar + Kaggle csv", "Kaggle folders + csv"])
def test_kaggle_labels_give_the_devkit_labels(download, tmp_path, layout):
    root = tmp_path / "kaggle"
    if layout == "val tar + Kaggle csv":
        write_archives(root, train=True, val=True)
    else:
        cls_loc = root / "ILSVRC/Data/CLS-LOC"
        for split, want in expected().items():
            for key, (data, label) in want.items():
                name = key[len("n01440764_"):] + ".JPEG"
                sub = cls_loc / "train" / WNIDS[label] if split == "train" else cls_loc / "val"
                sub.mkdir(parents=True, exist_ok=True)
                (sub / name).write_bytes(data)
    (root / "LOC_val_solution.csv").write_text(solution_csv())
    convert(root, tmp_path / "out.lmdb", ConvertOptions(**OPTIONS))
    assert contents(tmp_path / "out.lmdb") == expected()


def test_a_val_only_download_takes_the_devkit_leaf_classes_from_its_extracted_folder(download, tmp_path):
    root = write_archives(tmp_path / "val-only", train=False)
    with tarfile.open(download / "ILSVRC2012_devkit_t12.tar.gz") as devkit_tar:
        devkit_tar.extractall(root, filter="data")
    convert(root, tmp_path / "val.lmdb", ConvertOptions(**OPTIONS))
    assert read_manifest(tmp_path / "val.lmdb").classes == WNIDS  # n00001740 has children: not a class
    assert contents(tmp_path / "val.lmdb") == {"val": expected()["val"]}


@pytest.mark.parametrize("suffix", [".lmdb", ".wds"])
def test_a_killed_conversion_resumes_to_the_clean_result(download, tmp_path, suffix):
    clean, dst = tmp_path / f"clean{suffix}", tmp_path / f"resumed{suffix}"
    convert(download, clean, ConvertOptions(**OPTIONS))
    args = ["convert", str(download), str(dst), "--workers", "2", "--checkpoint-every", "4", "--shard-size", "64KiB",
            "-q"]
    kill_convert_when_stopped(args, after_shards(2) if suffix == ".wds" else after_checkpoint(8))
    assert not dst.exists()
    report = convert(download, dst, ConvertOptions(**OPTIONS, resume=True))
    assert 0 < report.processed < 19  # what the killed run finished was kept
    assert contents(dst) == contents(clean)
    assert read_manifest(dst).splits == read_manifest(clean).splits


def copy_of(download: Path, tmp_path: Path, **files: bytes | None) -> Path:
    root = tmp_path / "copy"
    shutil.copytree(download, root)
    for name, blob in files.items():
        path = root / name.replace("__", ".")
        path.unlink(missing_ok=True)
        if blob is not None:
            path.write_bytes(blob)
    return root


@pytest.mark.parametrize("files, message", [
    (dict(ILSVRC2012_devkit_t12__tar__gz=None),
     r"ILSVRC2012_img_val\.tar has no labels: put ILSVRC2012_devkit_t12\.tar\.gz .* or Kaggle's LOC_val_solution\.csv"),
    (dict(ILSVRC2012_devkit_t12__tar__gz=devkit(meta=False)),
     r"ILSVRC2012_devkit_t12\.tar\.gz holds no data/meta\.mat; the devkit is incomplete"),
    (dict(ILSVRC2012_devkit_t12__tar__gz=devkit(VAL_IDS[:5])),
     r"ILSVRC2012_validation_ground_truth\.txt has 5 labels but ILSVRC2012_img_val\.tar holds 6 images"),
    (dict(ILSVRC2012_devkit_t12__tar__gz=devkit([2, 1, 3, 1, 2, 9])),
     r"ground_truth\.txt line 6 \('9'\) is not an ILSVRC2012 id of data/meta\.mat"),
    (dict(ILSVRC2012_devkit_t12__tar__gz=b"not gzip"), r"ILSVRC2012_devkit_t12\.tar\.gz is not a readable \.tar\.gz"),
])
def test_missing_or_mismatched_labels_are_one_line_errors(download, tmp_path, capsys, files, message):
    root = copy_of(download, tmp_path, **files)
    assert main(["convert", str(root), str(tmp_path / "out.lmdb")]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("datapipe convert: error:")]
    assert len(errors) == 1 and re.search(message, errors[0]), errors
    assert not (tmp_path / "out.lmdb").exists()


def test_a_damaged_class_tar_is_one_line_naming_it(download, tmp_path):
    blob = bytearray((download / "ILSVRC2012_img_train.tar").read_bytes())
    second = blob.index(b"n01443537_3.JPEG")  # a header inside the second class tar
    blob[second + 148:second + 150] = b"99"  # its checksum
    root = copy_of(download, tmp_path, ILSVRC2012_img_train__tar=bytes(blob))
    with pytest.raises(ValueError, match=r"^n01443537\.tar inside .*ILSVRC2012_img_train\.tar: a tar header fails its "
                                         r"checksum at byte \d+"):
        list_tasks(root)


def test_split_keeps_one_split_with_the_train_class_list(download):
    task_list = list_tasks(download, split="val")
    assert task_list.splits == ["val"] and task_list.classes == WNIDS and len(task_list.tasks) == 6
    assert all(isinstance(t.path, ArchiveMember) for t in task_list.tasks)
    with pytest.raises(ValueError, match=r"--split 'test': the ImageNet download in .* has train and val"):
        list_tasks(download, split="test")


def test_extracted_split_folders_beside_the_archives_convert_as_before(download, tmp_path):
    root = copy_of(download, tmp_path)
    (root / "train" / "cat").mkdir(parents=True)
    (root / "train" / "cat" / "a.jpg").write_bytes(jpeg(1))
    task_list = list_tasks(root)
    assert task_list.classes == ["cat"] and [type(t.path) for t in task_list.tasks] == [str]


def test_an_archive_gone_stops_the_run_while_a_member_cut_short_is_a_bad_file(download, tmp_path):
    tar = str(download / "ILSVRC2012_img_val.tar")
    task = list_tasks(download, split="val").tasks[0]
    member = task.path
    assert read_input(member) == expected()["val"][task.key][0]
    with pytest.raises(FileNotFoundError, match=r"ILSVRC2012_img_val\.tar:ILSVRC2012_val_"):
        read_input(ArchiveMember(member, str(tmp_path / "gone.tar"), member.offset, member.size))
    with pytest.raises(BadImageError, match="the archive ends inside this member"):
        read_input(ArchiveMember(member, tar, os.path.getsize(tar) - 100, member.size))


# -- the MAT v5 reader, against scipy's writer and MATLAB's compact storage --------------------------

def element(kind: int, data: bytes) -> bytes:
    if len(data) <= 4 and kind != 14:  # MATLAB's small data element: size and type share the tag
        return struct.pack("<HH", kind, len(data)) + data.ljust(4, b"\0")
    return struct.pack("<II", kind, len(data)) + data + b"\0" * (-len(data) % 8)


def matlab_double(name: bytes, values: bytes, kind: int = 2) -> bytes:
    """A double array as MATLAB stores small integers: class mxDOUBLE, data as miUINT8 (kind 2)."""
    flags = element(6, struct.pack("<II", 6, 0)) + element(5, struct.pack("<ii", 1, len(values)))
    return element(14, flags + element(1, name) + element(kind, values))


def test_mat_reader_reads_scipy_files_and_matlab_compact_compressed_elements():
    for compress in (False, True):
        synsets = read_mat(meta_mat(compress))["synsets"]
        assert [(s["ILSVRC2012_ID"], s["WNID"], s["num_children"]) for s in synsets] == [
            ([float(k)], w, [0.0 if k <= 3 else 3.0]) for k, w in ILSVRC_IDS.items()]
        assert synsets[0]["gloss"] == "a gloss, ü" and synsets[0]["children"] == []
        assert synsets[3]["children"] == [1, 2, 3]
    header = b"MATLAB 5.0 MAT-file".ljust(116) + b"\0" * 8 + b"\x00\x01IM"
    plain = matlab_double(b"ids", bytes([7, 200, 1]))
    packed = zlib.compress(matlab_double(b"x", bytes([5])))
    blob = header + plain + struct.pack("<II", 15, len(packed)) + packed
    assert read_mat(blob) == {"ids": [7, 200, 1], "x": [5]}


@pytest.mark.parametrize("blob, message", [
    (b"MATLAB 7.3 MAT-file".ljust(128, b" "), "MATLAB 7.3 .HDF5. file"),
    (b"\0" * 128, "not a MATLAB v5 .mat file"),
    (b"MATLAB 5.0".ljust(124) + b"\x00\x01IM" + struct.pack("<II", 14, 1 << 30), "claiming 1073741824 bytes past"),
    (b"MATLAB 5.0".ljust(124) + b"\x00\x01IM" + struct.pack("<II", 15, 4) + b"xxxx", "does not inflate"),
])
def test_mat_reader_refuses_what_it_cannot_trust(blob, message):
    with pytest.raises(ValueError, match=message):
        read_mat(blob, where="meta.mat")
