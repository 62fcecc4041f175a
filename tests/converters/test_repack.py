"""`convert` from a packed dataset into another format (converters.repack): records, keys, labels,
classes, fields and the encoded bytes kept exactly, every split, a manifest that verifies, convert's
--overwrite and --resume rules, an atomic finish, and one-line refusals."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from converters import ConvertError, ConvertOptions, convert
from datapipe import open_dataset, read_manifest
from datapipe.cli.main import main
from datapipe.formats import staging_path
from datapipe.formats.lmdb import LmdbWriter
from datapipe.formats.wds import WdsDataset
from datapipe.formats.inspect import verify
from datapipe.records import Fields, Manifest, Record, SplitInfo, record_digest
from tests.converters.faults import deadline
from tests.converters.stopping import after_checkpoint, kill_convert_when_stopped
from tests.storage.conftest import s3, s3_wds  # noqa: F401  (fixtures: moto's S3 on 127.0.0.1, the .wds there)

OPTIONS = ConvertOptions(progress=False, shard_bytes=64 << 10)


def contents(path: Path | str) -> tuple[list[str], dict[str, list[tuple]]]:
    """The class list and, per split, every record (key, bytes, label, original path, fields) in order."""
    manifest = read_manifest(path)
    splits = {}
    for split in manifest.splits:
        ds = open_dataset(path, split)
        splits[split] = [(r.key, r.data, r.label, r.path, r.fields) for r in map(ds.record, range(len(ds)))]
    return manifest.classes, splits


def by_key(splits: dict[str, list[tuple]]) -> dict[str, dict[str, tuple]]:
    return {split: {r[0]: r for r in records} for split, records in splits.items()}


def test_lmdb_to_wds_to_h5_to_lmdb_keeps_every_record_byte_exact(packed_lmdb, tmp_path):
    classes, original = contents(packed_lmdb)
    chain = [tmp_path / "a.wds", tmp_path / "b.h5", tmp_path / "c.lmdb"]
    previous = packed_lmdb
    for dst in chain:
        report = convert(previous, dst, OPTIONS)
        assert report.source_format == read_manifest(previous).format and report.processed == 31
        assert verify(dst, progress=False).ok
        got_classes, got = contents(dst)
        assert got_classes == classes == ["cat", "dog", "fish"]
        assert by_key(got) == by_key(original)  # keys, bytes, labels, paths, fields: every split
        manifest = read_manifest(dst)
        assert [e["path"] for e in manifest.splits["train"].skipped] == \
               [e["path"] for e in read_manifest(packed_lmdb).splits["train"].skipped]  # the source's, kept
        assert manifest.arguments["repacked_from"]["format"] == read_manifest(previous).format
        previous = dst
    shuffled = contents(chain[0])[1]
    assert [r[0] for r in shuffled["train"]] != [r[0] for r in original["train"]]  # .wds from LMDB: shuffled
    assert contents(chain[1])[1] == contents(chain[2])[1] == shuffled  # from .wds on: its order kept
    assert len(WdsDataset(chain[0], read_manifest(chain[0]), "train").shard_entries()) > 1


def write_lmdb_with_fields(dst: Path) -> None:
    """An LMDB dataset, written by its own writer, whose records carry every field (caption, metadata,
    multi-labels) and a caption a record of another split lacks."""
    images = sorted((Path(__file__).resolve().parents[2] / "fixtures/imagefolder/train/cat").glob("cat_00*.jpg"))
    staging = staging_path(dst)
    writer = LmdbWriter(staging, size_hint=1 << 20, shard_bytes=0)
    splits = {"train": SplitInfo(), "val": SplitInfo()}
    for i, image in enumerate(images):
        split = "train" if i % 3 else "val"
        fields = Fields(f"caption ü {i}\nline two" if i % 2 else None, json.dumps({"n": i}, separators=(",", ":")),
                        (0, 1) if i % 2 else (2,))
        data = image.read_bytes()
        key = f"cat_{i:03d}"
        record = Record(key, data, i % 3, f"train/cat/{image.name}", record_digest(key, i % 3, data, fields), fields)
        writer.write(split, splits[split].samples, record)
        splits[split].add(record)
    writer.close(Manifest("lmdb", ["cat", "dog", "fish"], splits))
    staging.rename(dst)


@pytest.mark.parametrize("suffix", [".wds", ".h5", ".lmdb"])
def test_captions_metadata_and_multi_labels_are_kept(tmp_path, suffix):
    src, dst = tmp_path / "fields.lmdb", tmp_path / f"out{suffix}"
    write_lmdb_with_fields(src)
    convert(src, dst, OPTIONS)
    assert by_key(contents(dst)[1]) == by_key(contents(src)[1])
    assert verify(dst, progress=False).ok
    assert read_manifest(dst).splits["train"].fields == ["text", "meta", "labels"]


def test_overwrite_and_resume_rules_are_converts(packed_hdf5, tmp_path):
    dst = tmp_path / "out.wds"
    convert(packed_hdf5, dst, OPTIONS)
    with pytest.raises(ConvertError, match="already exists; pass --overwrite to replace it"):
        convert(packed_hdf5, dst, OPTIONS)
    with pytest.raises(ConvertError, match="is complete: there is nothing to resume"):
        convert(packed_hdf5, dst, ConvertOptions(progress=False, resume=True))
    with pytest.raises(ConvertError, match="must not be the source folder or inside it"):
        convert(dst, dst / "inner.lmdb", OPTIONS)
    before = contents(dst)
    convert(packed_hdf5, dst, ConvertOptions(progress=False, shard_bytes=64 << 10, overwrite=True))
    assert contents(dst) == before  # the same options: the same output (the shuffle is seeded)
    assert not staging_path(dst).exists() and not Path(f"{dst}.old").exists()


@pytest.mark.parametrize("suffix", [".lmdb", ".h5", ".wds"])
def test_an_interrupted_repack_resumes_to_the_uninterrupted_output(packed_wds, tmp_path, suffix):
    dst, whole = tmp_path / f"out{suffix}", tmp_path / f"whole{suffix}"
    args = ["convert", str(packed_wds), str(dst), "--checkpoint-every", "5", "--shard-size", "64KiB", "-q"]
    with deadline():
        kill_convert_when_stopped(args, after_checkpoint(10))
    assert staging_path(dst).exists() and not dst.exists()  # nothing at dst until the rename
    with pytest.raises(ConvertError, match="an interrupted conversion left .*pass --resume"):
        convert(packed_wds, dst, OPTIONS)
    assert main([*args, "--resume"]) == 0
    convert(packed_wds, whole, OPTIONS)
    assert contents(dst) == contents(whole) and verify(dst, progress=False).ok
    assert read_manifest(dst).splits["train"].digest == read_manifest(whole).splits["train"].digest


def test_a_damaged_record_stops_the_repack_naming_it(packed_lmdb, tmp_path):
    src = tmp_path / "src.h5"
    convert(packed_lmdb, src, OPTIONS)
    ds = open_dataset(src)
    data = ds.record(3).data
    blob = src.read_bytes()
    at = blob.index(data)
    src.write_bytes(blob[:at + 100] + bytes([blob[at + 100] ^ 0xFF]) + blob[at + 101:])
    dst = tmp_path / "out.lmdb"
    with pytest.raises(ConvertError, match=r"split 'train' record 3 does not match its checksum .*`datapipe verify "):
        convert(src, dst, OPTIONS)
    assert not dst.exists()


def crafted(src: Path, keys: list[str], *, samples: int | None = None) -> Path:
    """An LMDB dataset written by its own writer, one record a key, each checksum right (what a hostile
    author can make); `samples`: the count its manifest claims."""
    staging = staging_path(src)
    writer = LmdbWriter(staging, size_hint=1 << 20, shard_bytes=0)
    info = SplitInfo()
    data = b"\xff\xd8\xff" + b"x" * 100
    for i, key in enumerate(keys):
        record = Record(key, data, 0, "evil.jpg", record_digest(key, 0, data))
        writer.write("train", i, record)
        info.add(record)
    info.samples = info.samples if samples is None else samples
    writer.close(Manifest("lmdb", ["a"], {"train": info}))
    staging.rename(src)
    return src


@pytest.mark.parametrize("keys, match", [(["../../evil.jpg"], r"key '\.\./\.\./evil\.jpg' is not a record key"),
                                         (["k.jpg\0"], r"key 'k\.jpg\\x00' is not a record key"),
                                         (["same", "other", "same"], r"repeats the key of 1 record\(s\)")])
def test_a_crafted_key_is_refused(tmp_path, keys, match):
    with pytest.raises(ValueError, match=match):
        convert(crafted(tmp_path / "crafted.lmdb", keys), tmp_path / "out.wds", OPTIONS)
    assert not (tmp_path / "out.wds").exists()


def test_a_crafted_count_is_refused_before_anything_is_sized_from_it(tmp_path):
    """A manifest counting 10^12 records sized the shuffle's permutation (8 TB) before any was read."""
    src = crafted(tmp_path / "crafted.lmdb", ["k"], samples=10**12)
    with pytest.raises(ConvertError, match=r"counts 1000000000000 records, more than its \d+ bytes of files can hold"):
        convert(src, tmp_path / "out.wds", OPTIONS)


def test_a_damaged_progress_file_is_one_line(packed_lmdb, tmp_path):
    dst = tmp_path / "out.wds"
    staging_path(dst).mkdir()
    (staging_path(dst) / "progress.json").write_text("{}")
    with pytest.raises(ValueError, match=r"progress\.json is damaged \(KeyError: 'splits'\); --overwrite starts"):
        convert(packed_lmdb, dst, ConvertOptions(progress=False, resume=True))
    convert(packed_lmdb, dst, ConvertOptions(progress=False, overwrite=True))


@pytest.mark.parametrize("option, flag", [(dict(resize_max=64), "--resize-max"), (dict(labels="x.csv"), "--labels"),
                                          (dict(awkward="png"), "--awkward"), (dict(validate="fast"), "--validate")])
def test_image_options_are_refused_in_one_line(packed_lmdb, tmp_path, option, flag):
    with pytest.raises(ConvertError, match=f"{flag} applies to image files; .* is a packed lmdb dataset") as caught:
        convert(packed_lmdb, tmp_path / "out.wds", ConvertOptions(progress=False, **option))
    assert "\n" not in str(caught.value)


def test_one_split_with_split(packed_lmdb, tmp_path):
    convert(packed_lmdb, tmp_path / "val.h5", ConvertOptions(progress=False, split="val"))
    assert list(read_manifest(tmp_path / "val.h5").splits) == ["val"]
    with pytest.raises(ValueError, match="split 'test' not in this dataset"):
        convert(packed_lmdb, tmp_path / "test.h5", ConvertOptions(progress=False, split="test"))


def test_the_cli_says_records_and_from_which_format(packed_lmdb, tmp_path, capsys):
    assert main(["convert", str(packed_lmdb), str(tmp_path / "out.wds"), "-q"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"wrote {tmp_path / 'out.wds'} (wds, from lmdb) in ") and ": 31 records, " in out[0]
    assert out[1:] == ["  train: 27 samples, 97.3 KB, 0 skipped", "  val: 4 samples, 9.1 KB, 0 skipped"]


def test_a_packed_source_is_not_read_as_other_tools_shards(packed_wds, tmp_path):
    """Before: a .wds source was read as shards of another tool, its splits merged into one 'train'."""
    shutil.copytree(packed_wds, tmp_path / "in.wds")
    convert(tmp_path / "in.wds", tmp_path / "out.lmdb", OPTIONS)
    assert sorted(read_manifest(tmp_path / "out.lmdb").splits) == ["train", "val"]


def test_a_wds_in_object_storage_repacks_to_a_local_path(s3_wds, packed_wds, tmp_path):  # noqa: F811
    convert(s3_wds, tmp_path / "local.lmdb", OPTIONS)
    assert contents(tmp_path / "local.lmdb") == contents(packed_wds)
    with pytest.raises(ConvertError, match="a packed dataset is repacked to a local path"):
        convert(packed_wds, s3_wds.rsplit("/", 1)[0] + "/copy.wds", OPTIONS)
