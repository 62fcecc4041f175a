"""Image folders with sidecars: a caption `NAME.txt` and metadata `NAME.json` beside `NAME.jpg`. The scan
reads them (a bad one skips its image at convert, the reason naming the sidecar), a folder read in place
serves them, `datapipe info` shows the fields, and `--resume` after a caption changed never publishes a mix."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from converters import ConvertError, ConvertOptions, convert
from datapipe import open_dataset, read_manifest
from datapipe.cli.main import main
from datapipe.formats import staging_path
from datapipe.records import NO_FIELDS, canonical_meta
from datapipe.formats.scan import scan_folder
from tests.conftest import IMAGEFOLDER
from tests.converters.faults import deadline
from tests.converters.test_tar_shards import BAD_FIELDS, GOOD_FIELDS
from tests.converters.stopping import after_checkpoint, after_shards, kill_convert_when_stopped
from tests.fields_data import CAPTIONS, IMAGES, METAS, expected_fields, write_bad_sidecars, write_caption_folder
from tests.storage.conftest import s3  # noqa: F401  (a fixture: moto's S3 server on 127.0.0.1)
from tests.storage.test_convert_remote import upload_folder

SUFFIX = {"lmdb": ".lmdb", "hdf5": ".h5", "wds": ".wds"}


@pytest.fixture(scope="module")
def captions(tmp_path_factory) -> Path:
    return write_caption_folder(tmp_path_factory.mktemp("captions") / "src")


@pytest.fixture(scope="module")
def with_bad(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    root = write_caption_folder(tmp_path_factory.mktemp("bad-sidecars") / "src")
    return root, write_bad_sidecars(root)


def test_the_scan_reads_each_images_sidecars_and_a_lone_text_file_is_no_caption(captions):
    layout = scan_folder(captions)
    files = {f.relpath: f for split in layout.splits.values() for f in split}
    assert sorted(files) == sorted(IMAGES) and not any(layout.skipped.values())  # notes.txt: neither image nor bad
    assert {p: f.fields for p, f in files.items()} == {p: expected_fields(p) for p in IMAGES}
    assert files["train/cat/cat_001.jpg"].fields.text == CAPTIONS["train/cat/cat_001.jpg"][:-1]  # one "\n" dropped
    meta = files["train/cat/cat_000.jpg"].fields.meta  # canonical (records.canonical_meta), the same object
    assert meta == canonical_meta(METAS["train/cat/cat_000.jpg"]) and json.loads(meta) == METAS["train/cat/cat_000.jpg"]
    assert all(f.fields is NO_FIELDS for f in scan_folder(IMAGEFOLDER).splits["train"])


@pytest.mark.parametrize("fmt", sorted(SUFFIX))
def test_a_bad_sidecar_skips_its_image_with_a_reason_naming_it_and_the_run_goes_on(with_bad, tmp_path, fmt):
    src, reasons = with_bad
    dst = tmp_path / f"out{SUFFIX[fmt]}"
    report = convert(src, dst, ConvertOptions(progress=False, workers=2))
    skipped = {s["path"]: s["reason"] for info in report.splits.values() for s in info.skipped}
    assert sorted(skipped) == sorted(reasons)
    for path, pattern in reasons.items():
        assert re.search(pattern, skipped[path]), skipped[path]
    assert read_manifest(dst).errors == len(reasons)
    for split in ("train", "val"):
        ds = open_dataset(dst, split)
        records = [ds.record(i) for i in range(len(ds))]
        assert sorted(r.path for r in records) == sorted(p for p in IMAGES if p.startswith(split))
        assert all(r.fields == expected_fields(r.path) for r in records)


def test_captions_in_object_storage_are_read_as_on_a_disk(s3, captions, tmp_path):  # noqa: F811
    source = upload_folder(s3, captions, "captions")
    options = ConvertOptions(progress=False, workers=1)
    convert(source, tmp_path / "from-s3.wds", options)
    convert(captions, tmp_path / "from-disk.wds", options)
    for split in ("train", "val"):
        remote, local = open_dataset(tmp_path / "from-s3.wds", split), open_dataset(tmp_path / "from-disk.wds", split)
        assert remote.fields == local.fields != ()
        assert [remote.record(i) for i in range(len(remote))] == [local.record(i) for i in range(len(local))]


def test_a_folder_read_in_place_serves_its_captions_and_metadata(captions, tmp_path):
    for split, carried in (("train", ("text", "meta")), ("val", ("text",))):
        ds = open_dataset(captions, split, cache_dir=tmp_path / "cache")
        assert ds.fields == carried
        records = [ds.record(i) for i in range(len(ds))]
        assert {r.path: r.fields for r in records} == {p: expected_fields(p) for p in IMAGES if p.startswith(split)}
        assert [ds[i] for i in range(len(ds))] == [r.sample for r in records]
    assert open_dataset(IMAGEFOLDER, cache_dir=tmp_path / "cache").fields == ()  # notes.txt is beside no image


def test_a_bad_sidecar_read_in_place_fails_that_record_naming_it_and_not_its_image(with_bad, tmp_path):
    src, _ = with_bad
    ds = open_dataset(src, "train", cache_dir=tmp_path / "cache")
    index = next(i for i in range(len(ds)) if ds.origin(i) == "train/dog/dog_004.jpg")
    with pytest.raises(ValueError, match=r"caption train/dog/dog_004\.txt is not UTF-8 text"):
        ds.record(index)
    assert ds[index].data == (src / "train/dog/dog_004.jpg").read_bytes()  # an image-and-label loader reads on


def test_info_shows_the_fields_each_split_carries(captions, tmp_path, capsys):
    dst = tmp_path / "out.wds"
    convert(captions, dst, ConvertOptions(progress=False, workers=1))
    shown = {}
    for path in (dst, captions, IMAGEFOLDER):
        assert main(["info", str(path)]) == 0
        shown[path] = capsys.readouterr().out
    for path in (dst, captions):
        assert re.search(r"^  train: 12 samples.*, 0 skipped, fields: text, meta$", shown[path], re.M), shown[path]
        assert re.search(r"^  val: 2 samples.*, 0 skipped, fields: text$", shown[path], re.M), shown[path]
    assert "fields" not in shown[IMAGEFOLDER]  # a dataset without fields: as before
    assert re.search(r"^  train: \d+ samples, \d+ skipped$", shown[IMAGEFOLDER], re.M), shown[IMAGEFOLDER]


@pytest.mark.parametrize("fmt", ["lmdb", "wds"])
def test_resume_after_a_caption_changed_is_refused_as_for_a_changed_label(captions, tmp_path, fmt):
    src = tmp_path / "src"
    shutil.copytree(captions, src)
    dst = tmp_path / f"out{SUFFIX[fmt]}"
    args = ["convert", str(src), str(dst), "--workers", "1", "--checkpoint-every", "2", "--shard-size", "64KiB", "-q"]
    with deadline():
        kill_convert_when_stopped(args, after_shards(1) if fmt == "wds" else after_checkpoint(2))
    assert staging_path(dst).is_dir() and not dst.exists()
    caption = src / "train/cat/cat_000.txt"
    caption.write_text("a dog on a mat\n", encoding="utf-8")  # same size: only the bytes changed
    resume = ConvertOptions(progress=False, resume=True, workers=1, checkpoint_every=2, shard_bytes=64 << 10)
    with pytest.raises(ConvertError, match=r"changed since the interrupted conversion; --overwrite starts over"):
        convert(src, dst, resume)
    assert not dst.exists()
    convert(src, dst, ConvertOptions(progress=False, overwrite=True, workers=1, shard_bytes=64 << 10))
    ds = open_dataset(dst)
    assert {ds.record(i).path: ds.record(i).fields.text for i in range(len(ds))}["train/cat/cat_000.jpg"] == \
        "a dog on a mat"


def test_a_bad_sidecar_is_refused_in_the_words_a_shard_member_is_and_read_in_place_alike(tmp_path):
    """The folder scan, a folder read in place and other tools' shards (tests/converters/test_tar_shards.py,
    tests/formats/test_img2dataset.py) share one parser (datapipe.formats.field_text): the same bytes, the same reason;
    JSON nested past the recursion limit among them. A sidecar's one trailing newline is dropped (a shard
    member's is kept)."""
    image = (IMAGEFOLDER / "train/cat/cat_000.jpg").read_bytes()
    folder = tmp_path / "src" / "cat"
    folder.mkdir(parents=True)
    sidecars = {key: {"txt": text, "json": meta} for key, (text, meta) in GOOD_FIELDS.items()}
    sidecars |= {key: {"txt": b"caption", "json": b"{}", ext: blob} for key, (ext, blob, _) in BAD_FIELDS.items()}
    for key, members in sidecars.items():
        (folder / f"{key}.jpg").write_bytes(image)
        for ext, blob in members.items():
            (folder / f"{key}.{ext}").write_bytes(blob)
    layout = scan_folder(tmp_path / "src")
    skipped = {s["path"]: s["reason"] for s in layout.skipped["train"]}
    assert sorted(skipped) == [f"cat/{key}.jpg" for key in sorted(BAD_FIELDS)]
    kind = {"txt": "caption", "json": "metadata"}
    for key, (ext, _, reason) in BAD_FIELDS.items():
        said = f"{kind[ext]} cat/{key}.{ext} {reason}"
        assert skipped[f"cat/{key}.jpg"].startswith(said) and "\n" not in skipped[f"cat/{key}.jpg"]
    kept = {Path(f.relpath).stem: (f.fields.text, json.loads(f.fields.meta)) for f in layout.splits["train"]}
    assert kept == {"000000000": ("kept as written", {"a": "ok"}), "000000006": ("caption 6", {"exif": "\ud800x"})}
    ds = open_dataset(tmp_path / "src", cache_dir=tmp_path / "cache")
    bad = [i for i in range(len(ds)) if ds.origin(i) in skipped]
    assert len(bad) == len(BAD_FIELDS)
    for i in bad:
        with pytest.raises(ValueError) as raised:
            ds.record(i)
        assert str(raised.value) == skipped[ds.origin(i)]
