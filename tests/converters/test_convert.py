"""Conversion behaviour: refusal to overwrite, strict mode, determinism, labels CSV, resize, damage."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from converters import ConvertError, ConvertOptions, convert
from datapipe import open_dataset, read_manifest
from datapipe.formats.inspect import verify
from tests.conftest import IMAGEFOLDER

QUIET = dict(progress=False, workers=1)


def records(path, split="train"):
    ds = open_dataset(path, split)
    return [ds.record(i) for i in range(len(ds))]


def test_existing_output_is_refused_without_overwrite(tmp_path):
    dst = tmp_path / "out.lmdb"
    convert(IMAGEFOLDER / "val", dst, ConvertOptions(**QUIET))
    with pytest.raises(ConvertError, match="already exists; pass --overwrite"):
        convert(IMAGEFOLDER, dst, ConvertOptions(**QUIET))
    assert len(open_dataset(dst)) == 4  # untouched
    convert(IMAGEFOLDER, dst, ConvertOptions(overwrite=True, **QUIET))
    assert len(open_dataset(dst)) == 27 and not (tmp_path / "out.lmdb.old").exists()


def test_resume_of_a_finished_output_says_there_is_nothing_to_resume(tmp_path):
    dst = tmp_path / "done.lmdb"
    convert(IMAGEFOLDER / "val", dst, ConvertOptions(**QUIET))
    with pytest.raises(ConvertError, match="is complete: there is nothing to resume"):
        convert(IMAGEFOLDER / "val", dst, ConvertOptions(resume=True, **QUIET))


def test_strict_stops_at_the_first_bad_file_and_leaves_nothing(tmp_path):
    dst = tmp_path / "out.h5"
    with pytest.raises(ConvertError, match=r"truncated\.jpg: corrupt or truncated.*--strict"):
        convert(IMAGEFOLDER, dst, ConvertOptions(strict=True, **QUIET))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("suffix", [".lmdb", ".h5", ".wds"])
def test_output_does_not_depend_on_worker_count(tmp_path, suffix):
    one, two = tmp_path / f"one{suffix}", tmp_path / f"two{suffix}"
    convert(IMAGEFOLDER, one, ConvertOptions(progress=False, workers=1, shard_bytes=64 << 10))
    convert(IMAGEFOLDER, two, ConvertOptions(progress=False, workers=2, shard_bytes=64 << 10))
    assert records(one) == records(two)
    assert read_manifest(one).splits == read_manifest(two).splits


def test_wds_is_shuffled_at_write_time_and_sharded_by_size(tmp_path):
    dst = tmp_path / "s.wds"
    convert(IMAGEFOLDER, dst, ConvertOptions(shard_bytes=64 << 10, **QUIET))
    order = [r.path for r in records(dst)]
    assert order != sorted(order, key=lambda p: (p.split("/")[1], p))
    shards = list(open_dataset(dst).shard_entries())
    assert len(shards) >= 2 and sum(s["samples"] for s in shards) == 27
    assert all((dst / s["name"]).is_file() and (dst / s["name"].replace(".tar", ".idx")).is_file() for s in shards)
    other = tmp_path / "other.wds"
    convert(IMAGEFOLDER, other, ConvertOptions(shard_bytes=64 << 10, seed=1, **QUIET))
    assert [r.path for r in records(other)] != order


def test_flat_folder_with_labels_csv_converts_to_val(tmp_path):
    flat = tmp_path / "flat"
    flat.mkdir()
    rows = ["filename,class"]
    for i, f in enumerate(sorted((IMAGEFOLDER / "val").rglob("*.jpg"))):
        shutil.copy(f, flat / f"v_{i}.JPEG")
        rows.append(f"v_{i}.JPEG,{f.parent.name}")
    (tmp_path / "labels.csv").write_text("\n".join(rows) + "\n")
    dst = tmp_path / "val.wds"
    convert(flat, dst, ConvertOptions(labels=str(tmp_path / "labels.csv"), **QUIET))
    got = sorted((r.path, r.label) for r in records(dst, "val"))
    assert got == [("v_0.JPEG", 0), ("v_1.JPEG", 0), ("v_2.JPEG", 1), ("v_3.JPEG", 1)]


def test_resize_max_stores_smaller_jpegs(tmp_path):
    from PIL import Image
    dst = tmp_path / "small.lmdb"
    convert(IMAGEFOLDER, dst, ConvertOptions(resize_max=32, quality=80, **QUIET))
    for r in records(dst):
        img = Image.open(__import__("io").BytesIO(r.data))
        assert img.format == "JPEG" and min(img.size) <= 32
    assert read_manifest(dst).arguments["resize_max"] == 32


def test_quality_without_resize_max_is_a_one_line_error_not_silently_ignored(tmp_path, capsys):
    """--quality only sets the quality of --resize-max's re-encode: alone it would store the original
    bytes while the user believes they are re-encoded. Nothing is written."""
    from datapipe.cli.main import main

    assert main(["convert", str(IMAGEFOLDER), str(tmp_path / "out.lmdb"), "--quality", "90", "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "add --resize-max N" in err
    assert not (tmp_path / "out.lmdb").exists()


def _flip_one_stored_byte(path: Path, data: bytes) -> None:
    """Flip a byte of the record's stored bytes, in every place they stand: an LMDB file can hold stale
    copies in pages a transaction freed (a batch put again after its map grew), and flipping only the
    first copy found left the live one intact now and then (a full suite's run)."""
    needle, found = data[len(data) // 2: len(data) // 2 + 48], False
    for f in ([path] if path.is_file() else sorted(path.iterdir())):
        blob = bytearray(f.read_bytes())
        at = blob.find(needle)
        while at >= 0:
            blob[at + 20] ^= 0xFF
            found, at = True, blob.find(needle, at + 1)
        if found:
            f.write_bytes(bytes(blob))
            return
    raise AssertionError("stored bytes not found")


def test_verify_names_the_record_with_a_flipped_byte(packed_copy):
    victim = records(packed_copy)[5]
    _flip_one_stored_byte(packed_copy, victim.data)
    report = verify(packed_copy, progress=False)
    assert not report.ok
    assert f"record 5 (key {victim.key}" in report.problems[0] and "checksum mismatch" in report.problems[0]
    cli = subprocess.run([sys.executable, "-m", "datapipe", "verify", str(packed_copy)], capture_output=True, text=True)
    assert cli.returncode == 1 and victim.key in cli.stdout and "DAMAGED" in cli.stdout


def test_open_dataset_errors_are_clear(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        open_dataset(tmp_path / "nothing.lmdb")
    (tmp_path / "junk.h5").write_bytes(b"not hdf5")
    with pytest.raises(ValueError, match="not a datapipe dataset"):
        open_dataset(tmp_path / "junk.h5")
    with pytest.raises(ValueError, match="cannot tell the format .* --format"):
        convert(IMAGEFOLDER, tmp_path / "out.zip", ConvertOptions(**QUIET))


def test_verify_checks_the_i64_member_dali_reads_labels_from(packed_wds, tmp_path):
    import numpy as np

    from datapipe.formats.tar import parse_idx

    copy = tmp_path / "copy.wds"
    shutil.copytree(packed_wds, copy)
    shard = sorted(copy.glob("train-*.tar"))[0]
    components = {c[0]: c for c in parse_idx(shard.with_suffix(".idx").read_text())[2]}
    _, offset, size, _ = components["i64"]
    with open(shard, "r+b") as fh:
        fh.seek(offset)
        index, label = np.frombuffer(fh.read(size), dtype="<i8")
        fh.seek(offset)
        fh.write(np.array([index, (label + 1) % 3], dtype="<i8").tobytes())
    report = verify(copy, progress=False)
    assert not report.ok and f".i64 says (position, label) = [{index}, {(label + 1) % 3}]" in report.problems[0]


def test_paths_with_braces_and_names_that_are_not_utf8(tmp_path):
    """A dataset under `run{1}/` opens from a str; a source file whose name is not UTF-8 converts,
    its name recorded with \\\\x escapes."""
    src = tmp_path / "src"
    shutil.copytree(IMAGEFOLDER / "val", src)
    os.rename(src / "cat" / "cat_000.jpg", os.fsencode(src / "cat") + b"/caf\xe9.jpg")
    for suffix in (".lmdb", ".h5", ".wds"):
        dst = tmp_path / "run{1}" / f"out{suffix}"
        convert(src, dst, ConvertOptions(**QUIET))
        ds = open_dataset(str(dst))
        assert len(ds) == 4 and "cat/caf\\xe9.jpg" in {ds.record(i).path for i in range(len(ds))}


def test_a_file_that_changes_after_validation_is_skipped_not_stored(tmp_path):
    """The writer reads a validated original again (its bytes do not cross a pipe); what it reads
    must be what the worker checked."""
    from converters.pack import _init_worker, _prepare, _stored_bytes
    from converters.tasks import Task
    from datapipe.image.headers import BadImageError

    path = tmp_path / "a.jpg"
    shutil.copy(IMAGEFOLDER / "train/cat/cat_000.jpg", path)
    task = Task("train", str(path), "a.jpg", "a", 0)
    _init_worker({})
    identity, _, _ = _prepare((task.path, task.key, task.label, task.fields))
    assert _stored_bytes(task, identity) == path.read_bytes()
    path.write_bytes((IMAGEFOLDER / "train/cat/cat_001.jpg").read_bytes())
    with pytest.raises(BadImageError, match="changed while it was being converted"):
        _stored_bytes(task, identity)


def test_default_shard_size_gives_every_dataset_enough_shards(tmp_path):
    from converters.pack import auto_shard_bytes

    assert 350e6 / auto_shard_bytes(350_000_000) > 20  # the 350 MB set: 2 shards at 256 MB
    assert 128 <= 10e9 / auto_shard_bytes(10_000_000_000) < 130
    assert auto_shard_bytes(140_000_000_000) == 256 << 20 and auto_shard_bytes(1000) == 16 << 20
    dst = tmp_path / "auto.wds"
    convert(IMAGEFOLDER, dst, ConvertOptions(**QUIET))
    assert read_manifest(dst).arguments["shard_bytes"] == 16 << 20  # resolved, recorded for --resume


@pytest.mark.parametrize("suffix", [".lmdb", ".h5", ".wds"])
def test_a_file_cut_inside_its_header_is_reported_and_the_run_goes_on(tmp_path, suffix):
    src = tmp_path / "src" / "train" / "cat"
    src.mkdir(parents=True)
    for good in sorted((IMAGEFOLDER / "train/cat").glob("cat_00*.jpg")):
        shutil.copy(good, src / good.name)
    (src / "header_cut.jpg").write_bytes((src / "cat_000.jpg").read_bytes()[:300])
    report = convert(tmp_path / "src", tmp_path / f"out{suffix}", ConvertOptions(**QUIET))
    skipped = read_manifest(tmp_path / f"out{suffix}").splits["train"].skipped
    assert report.skipped == 1 and [s["path"] for s in skipped] == ["train/cat/header_cut.jpg"]
    assert "truncated" in skipped[0]["reason"] and len(records(tmp_path / f"out{suffix}")) == 5


def test_split_picks_one_split_of_a_train_val_folder(tmp_path):
    """--split val on a SPLIT/CLASS/* folder converts val alone, labelled by train's classes; a split
    the folder lacks is a one-line error (it used to convert every split, silently)."""
    from converters import list_tasks

    task_list = list_tasks(IMAGEFOLDER, split="val")
    assert task_list.splits == ["val"] and task_list.classes == list_tasks(IMAGEFOLDER).classes
    convert(IMAGEFOLDER, tmp_path / "val.lmdb", ConvertOptions(split="val"))
    assert list(read_manifest(tmp_path / "val.lmdb").splits) == ["val"]
    with pytest.raises(ValueError, match=r"--split 'test': .* has the splits train, val"):
        list_tasks(IMAGEFOLDER, split="test")
