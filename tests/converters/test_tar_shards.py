"""`datapipe convert` from other tools' WebDataset shards (converters.tar_shards): img2dataset's
output folder (tools/make_img2dataset_sample.py) or a brace pattern, into every format, captions and
metadata carried byte-exact; a shard cut short reported in one line; --resume."""
from __future__ import annotations

import io
import json
import shutil
import tarfile
from pathlib import Path

import pytest

from converters import ConvertOptions, convert, list_tasks
from datapipe import open_dataset, read_manifest
from datapipe.cli.main import main
from datapipe.formats.inspect import verify
from datapipe.records import Fields, canonical_meta
from tests.conftest import IMAGEFOLDER
from tests.converters.stopping import after_checkpoint, kill_convert_when_stopped
from tools.make_img2dataset_sample import make

OPTIONS = dict(workers=2, progress=False, shard_bytes=64 << 10, checkpoint_every=4)
# One sample a kind of bad caption or metadata: key -> (its bad member, the bytes, what the reason says after
# naming the member). The folder scan, the shard converter and shards read in place say the same (field_text).
BAD_FIELDS = {
    "000000001": ("json", b"[" * 100_000 + b"]" * 100_000, "is JSON nested too deep to read"),
    "000000002": ("txt", b"caf\xe9", "is not UTF-8 text (byte 3)"),
    "000000003": ("json", b"[1, 2]", "is not a JSON object (it holds a JSON array)"),
    "000000004": ("json", b'{"n": 1' + b"0" * 5000 + b"}", "cannot be read as JSON (Exceeds the limit"),
    "000000005": ("json", b"{not json", "is not valid JSON ("),
}
GOOD_FIELDS = {  # key -> (.txt, .json): a member's newline is kept (a program wrote it); a lone surrogate is JSON
    "000000000": (b"kept as written\r\n", b'{"a": "ok"}'),
    "000000006": (b"caption 6", b'{"exif": "\\ud800x"}'),
}


def write_field_cases(shard: Path, more_good: int = 0) -> dict[str, dict[str, bytes]]:
    """A shard of the GOOD_FIELDS samples, one sample of each BAD_FIELDS case and `more_good` plain ones
    (keys 7, 8, ...), each `.jpg` (a fixture JPEG), `.json`, `.txt`; key -> its members, in key order."""
    image = (IMAGEFOLDER / "train/cat/cat_000.jpg").read_bytes()
    samples = {key: {"jpg": image, "json": meta, "txt": text} for key, (text, meta) in GOOD_FIELDS.items()}
    for key, (ext, blob, _) in BAD_FIELDS.items():
        samples[key] = {"jpg": image, "json": b"{}", "txt": b"caption", ext: blob}
    samples |= {f"{k:09d}": {"jpg": image, "json": b"{}", "txt": b"caption"} for k in range(7, 7 + more_good)}
    shard.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(shard, "w", format=tarfile.USTAR_FORMAT) as tar:
        for key in sorted(samples):
            for ext, data in samples[key].items():
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return {key: samples[key] for key in sorted(samples)}


@pytest.fixture(scope="module")
def sample(tmp_path_factory) -> tuple[Path, list[dict]]:
    root = tmp_path_factory.mktemp("i2d") / "data"
    return root, make(root, shards=3, per_shard=6, failed=1, seed=3)


def txt_members(root: Path) -> dict[str, bytes]:
    """key -> the bytes of its `.txt` member, read by Python's tarfile."""
    out = {}
    for shard in sorted(root.glob("*.tar")):
        with tarfile.open(shard) as tar:
            out |= {m.name[:-4]: tar.extractfile(m).read() for m in tar.getmembers() if m.name.endswith(".txt")}
    return out


def contents(dst: Path) -> dict[str, tuple]:
    ds = open_dataset(dst)
    return {r.key: (r.data, r.label, r.fields) for r in (ds.record(i) for i in range(len(ds)))}


@pytest.mark.parametrize("suffix", [".lmdb", ".h5", ".wds"])
def test_an_img2dataset_folder_converts_with_its_captions_byte_exact(sample, tmp_path, suffix):
    root, written = sample
    dst = tmp_path / f"out{suffix}"
    report = convert(root, dst, ConvertOptions(**OPTIONS))
    assert report.processed == len(written) and report.skipped == 0  # the sidecars are not inputs
    got = contents(dst)
    assert got == {s["__key__"]: (s["jpg"], -1, Fields(s["txt"], canonical_meta(s["json"]), None)) for s in written}
    assert {key: fields.text.encode("utf-8") for key, (_, _, fields) in got.items()} == txt_members(root)
    manifest = read_manifest(dst)
    assert manifest.classes == [] and manifest.splits["train"].fields == ["text", "meta"]
    assert verify(dst, progress=False).ok


def test_a_brace_pattern_converts_through_the_cli_and_multi_labels_come_from_cls(tmp_path, capsys):
    root = tmp_path / "data"
    written = make(root, shards=2, per_shard=5, failed=0, classes=4, seed=4)
    assert main(["convert", f"{root}/{{00000..00001}}.tar", str(tmp_path / "out.lmdb"), "--workers", "1", "-q"]) == 0
    ids = {s["__key__"]: tuple(sorted({int(t) for t in s["cls"].replace(",", " ").split()})) for s in written}
    assert any(len(v) > 1 for v in ids.values())
    got = contents(tmp_path / "out.lmdb")
    assert {key: (label, fields.labels) for key, (_, label, fields) in got.items()} == {
        key: (v[0], v) for key, v in ids.items()}
    top = max(max(v) for v in ids.values())
    assert read_manifest(tmp_path / "out.lmdb").classes == [str(c) for c in range(top + 1)]


def test_a_shard_cut_short_keeps_the_samples_before_the_damage_and_is_one_line(sample, tmp_path, capsys):
    root, written = sample
    copy = tmp_path / "data"
    shutil.copytree(root, copy)
    with tarfile.open(copy / "00001.tar") as tar:
        txts = [m for m in tar.getmembers() if m.name.endswith(".txt")]
    cut = txts[2]  # the third sample loses its caption: it is dropped with the rest
    with open(copy / "00001.tar", "r+b") as fh:
        fh.truncate(cut.offset_data + 3)
    assert main(["convert", str(copy), str(tmp_path / "out.wds"), "--workers", "1", "--shard-size", "64KiB"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.strip().startswith("skipped")]
    assert len(lines) == 1 and lines[0].strip().startswith("skipped 00001.tar: ")
    assert "the 2 samples before it are kept" in lines[0]
    shard1 = [s["__key__"] for s in written if int(s["__key__"]) // 10 == 1]  # keys: shard * 10 + row
    assert set(contents(tmp_path / "out.wds")) == {s["__key__"] for s in written} - set(shard1[2:])


def test_a_killed_conversion_resumes_to_the_clean_result(sample, tmp_path):
    root, written = sample
    clean, dst = tmp_path / "clean.lmdb", tmp_path / "resumed.lmdb"
    convert(root, clean, ConvertOptions(**OPTIONS))
    kill_convert_when_stopped(["convert", str(root), str(dst), "--workers", "2", "--checkpoint-every", "4", "-q"],
                              after_checkpoint(8))
    assert not dst.exists()
    report = convert(root, dst, ConvertOptions(**OPTIONS, resume=True))
    assert 0 < report.processed < len(written)
    assert read_manifest(dst).splits == read_manifest(clean).splits
    assert contents(dst) == contents(clean)


def test_a_changed_caption_changes_the_task_list(sample, tmp_path):
    """Captions are known at scan: one edited moves the task list's fingerprint (and --resume refuses)."""
    root, written = sample
    copy = tmp_path / "data"
    shutil.copytree(root, copy)
    first = dict(written[0], txt="another caption")
    shard = copy / "00000.tar"
    with tarfile.open(shard) as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]
    with tarfile.open(shard, "w") as tar:
        for m, data in members:
            data = first["txt"].encode() if m.name == f"{first['__key__']}.txt" else data
            m.size = len(data)
            tar.addfile(m, io.BytesIO(data))
    assert list_tasks(copy).fingerprint != list_tasks(root).fingerprint
    assert [t.fields.text for t in list_tasks(copy).tasks][0] == "another caption"


def test_a_bad_caption_or_metadata_skips_its_sample_with_the_reason_and_the_conversion_goes_on(tmp_path, capsys):
    """JSON nested past the recursion limit among them (it ended the run in a RecursionError traceback)."""
    shard, dst = tmp_path / "shards/00000.tar", tmp_path / "out.lmdb"
    write_field_cases(shard)
    assert main(["convert", str(shard.parent), str(dst), "--workers", "1", "-q"]) == 0
    skipped = {s["path"]: s["reason"] for s in read_manifest(dst).splits["train"].skipped}
    assert sorted(skipped) == [f"00000.tar:{key}.jpg" for key in sorted(BAD_FIELDS)]
    for key, (ext, _, reason) in BAD_FIELDS.items():
        got = skipped[f"00000.tar:{key}.jpg"]
        assert got.startswith(f"its .{ext} member {reason}") and "\n" not in got, got
    ds = open_dataset(dst)
    kept = {r.key: (r.fields.text, json.loads(r.fields.meta)) for r in (ds.record(i) for i in range(len(ds)))}
    assert kept == {"000000000": ("kept as written\r\n", {"a": "ok"}), "000000006": ("caption 6", {"exif": "\ud800x"})}
    assert verify(dst, progress=False).ok
