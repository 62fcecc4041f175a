"""img2dataset's WebDataset output read in place (datapipe.formats.wds_foreign): a folder of shards
with `.jpg`/`.txt`/`.json` members and no `.cls`, beside `.parquet` and `_stats.json` sidecars
(tools/make_img2dataset_sample.py writes it as img2dataset does); `.cls` members holding several ids."""
from __future__ import annotations

import io
import json
import pickle
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pytest

from datapipe import make_loader, open_dataset
from datapipe.formats.tar import BLOCK, END_OF_ARCHIVE, IDX_VERSION, member_header, padded, samples_before_damage
from datapipe.formats.wds_foreign import ForeignShardsDataset
from datapipe.records import Fields, canonical_meta
from tests.converters.test_tar_shards import BAD_FIELDS, write_field_cases
from tests.formats.test_index_memory import BATCH, JPEG, N, first_batch, open_read_and_batch
from tools.make_img2dataset_sample import make

SMALL = dict(backend="dataloader", batch_size=4, image_size=16, device="cpu", train=False, num_workers=0)


@pytest.fixture(scope="module")
def sample(tmp_path_factory) -> tuple[Path, list[dict]]:
    root = tmp_path_factory.mktemp("i2d") / "data"
    return root, make(root, shards=3, per_shard=6, failed=1, seed=1)


@pytest.fixture(scope="module")
def multi(tmp_path_factory) -> tuple[Path, list[dict]]:
    root = tmp_path_factory.mktemp("i2d-cls") / "data"
    return root, make(root, shards=2, per_shard=6, failed=0, classes=5, seed=2)


def ids_of(sample: dict) -> tuple[int, ...]:
    return tuple(sorted({int(t) for t in sample["cls"].replace(",", " ").split()}))


def records(ds) -> dict[str, tuple]:
    return {r.key: (r.data, r.label, r.fields) for r in (ds.record(i) for i in range(len(ds)))}


def test_every_record_once_with_its_caption_and_metadata_exact_and_label_minus_one(sample, tmp_path):
    root, written = sample
    want = {s["__key__"]: (s["jpg"], -1, Fields(s["txt"], canonical_meta(s["json"]), None)) for s in written}
    assert any("\n" in s["txt"] for s in written) and any(not s["txt"].isascii() for s in written)
    for source in (str(root), f"{root}/{{00000..00002}}.tar"):  # the folder, and the brace pattern
        ds = open_dataset(source, cache_dir=tmp_path / "cache")
        assert isinstance(ds, ForeignShardsDataset) and not ds.validated
        assert len(ds) == len(written) and records(ds) == want
        assert ds.fields == ("text", "meta") and ds.classes == []  # no .cls: no class list
        assert {ds.record(i).path.rsplit(":", 1)[0] for i in range(len(ds))} == {
            str(root / f"{n:05d}.tar") for n in range(3)}
    worker = pickle.loads(pickle.dumps(ds))  # a worker maps the index again and reads the same fields
    assert records(worker) == want


def test_the_sidecars_are_not_shards_and_each_shard_holds_its_downloads(sample, tmp_path):
    root, written = sample
    assert sorted(p.suffix for p in root.iterdir()).count(".parquet") == 3  # they are there, beside the shards
    ds = open_dataset(root, cache_dir=tmp_path / "cache")
    stats = [json.loads((root / f"{n:05d}_stats.json").read_text()) for n in range(3)]
    assert list(ds.shard_sizes()) == [s["successes"] for s in stats] == [5, 5, 5]  # failed downloads: no member


def test_make_loader_reads_the_folder_every_record_once_and_gives_captions(sample, tmp_path):
    root, written = sample
    loader = make_loader(str(root), cache_dir=tmp_path / "cache", **SMALL)
    batches = list(loader)
    assert sorted(np.concatenate([b.indices.numpy() for b in batches])) == list(range(len(written)))
    assert set(np.concatenate([b.labels.numpy() for b in batches])) == {-1}
    texts = make_loader(str(root), cache_dir=tmp_path / "cache", fields=("image", "text"), **SMALL)
    captions = {int(i): t for images, batch_texts, indices in texts for i, t in zip(indices, batch_texts)}
    ds = open_dataset(root, cache_dir=tmp_path / "cache")
    assert captions == {i: ds.record(i).fields.text for i in range(len(ds))}


def test_a_shard_cut_short_serves_the_samples_before_the_damage_with_one_warning(sample, tmp_path, caplog):
    """img2dataset killed mid-write leaves a shard cut short: read in place, its samples before the
    damage are served (the one whose caption was cut is dropped with the rest), the other shards whole."""
    root, written = sample
    copy = tmp_path / "data"
    shutil.copytree(root, copy)
    with tarfile.open(copy / "00001.tar") as tar:
        cut = [m for m in tar.getmembers() if m.name.endswith(".txt")][2]
    with open(copy / "00001.tar", "r+b") as fh:
        fh.truncate(cut.offset_data + 3)
    ds = open_dataset(copy, cache_dir=tmp_path / "cache")
    lost = [s["__key__"] for s in written if int(s["__key__"]) // 10 == 1][2:]  # keys: shard * 10 + row
    intact = records(open_dataset(root, cache_dir=tmp_path / "cache-intact"))
    assert list(ds.shard_sizes()) == [5, 2, 5] and records(ds) == {k: v for k, v in intact.items() if k not in lost}
    warned = [r.getMessage() for r in caplog.records if "00001.tar" in r.getMessage()]
    assert len(warned) == 1 and "the 2 samples before it are served and the rest of the shard is not" in warned[0]
    served = [i for b in make_loader(str(copy), cache_dir=tmp_path / "cache", **SMALL) for i in b.indices.tolist()]
    assert sorted(served) == list(range(len(ds)))


@pytest.mark.parametrize("samples, cut_in", [
    ({"a": ("jpg", "txt")}, "a.txt"),  # the shard's only sample
    ({"a": ("jpg", "json"), "b": ("jpg", "txt", "json")}, "b.json"),  # more members than the one before it
], ids=["only-sample", "more-members"])
def test_the_sample_a_cut_falls_in_is_never_kept_with_members_missing(tmp_path, samples, cut_in):
    shard = tmp_path / "cut.tar"
    with tarfile.open(shard, "w", format=tarfile.USTAR_FORMAT) as tar:
        for key, exts in samples.items():
            for ext in exts:
                blob = (f"{key}.{ext} " * 40).encode()
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(blob)
                tar.addfile(info, io.BytesIO(blob))
    with tarfile.open(shard) as tar:
        member = tar.getmember(cut_in)
    with open(shard, "r+b") as fh:
        fh.truncate(member.offset_data + 3)
    groups, _, damage = samples_before_damage(str(shard))
    assert damage and [{c[0] for c in g} for g in groups] == [{"jpg", "json"}] * (len(samples) - 1)


@pytest.mark.parametrize("which", ["folder", "pattern", "one"])
def test_info_describes_the_shards_and_their_fields(sample, which, capsys, monkeypatch, tmp_path):
    from datapipe.cli.main import main

    root, written = sample
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the index cache
    path = {"folder": root, "pattern": root / "{00000..00002}.tar", "one": root / "00001.tar"}[which]
    assert main(["info", str(path)]) == 0
    out = capsys.readouterr().out
    samples = len(written) if which != "one" else len(written) // 3
    assert "wds-shards, 0 classes" in out and f"train: {samples} samples" in out and "fields: text, meta" in out


def test_a_cls_with_several_ids_is_a_multi_label_record_whose_label_is_its_first(multi, tmp_path):
    root, written = multi
    ds = open_dataset(root, cache_dir=tmp_path / "cache")
    assert any(len(ids_of(s)) > 1 for s in written) and any("," in s["cls"] for s in written)
    assert ds.fields == ("text", "meta", "labels")
    assert ds.classes == [str(c) for c in range(max(max(ids_of(s)) for s in written) + 1)]
    want = {s["__key__"]: (s["jpg"], ids_of(s)[0], Fields(s["txt"], canonical_meta(s["json"]), ids_of(s)))
            for s in written}
    assert records(ds) == want


def test_a_cls_that_holds_no_class_numbers_skips_its_sample_with_a_warning_naming_it(tmp_path, caplog):
    """A bad label is a bad sample, as in convert (#38): the samples around it are served."""
    shard = tmp_path / "bad.tar"
    with tarfile.open(shard, "w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in (("a.cls", b"3 x"), ("a.jpg", JPEG), ("b.cls", b"1"), ("b.jpg", JPEG)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    ds = open_dataset(str(shard), cache_dir=tmp_path / "cache")
    assert [ds[i][:3:2] for i in range(len(ds))] == [("b", 1)] and ds.classes == ["0", "1"]
    assert f"skipped 1 sample(s) whose .cls holds no usable class ids, the first: {shard}: a.cls holds b'3 x', " \
           "not class numbers" in caplog.text


def write_image_text_shard(folder: Path) -> str:
    """A tar of ten img2dataset-like samples (`.cls` with two ids, `.jpg`, `.json`, `.txt`) and a DALI
    index of N samples pointing at them."""
    folder.mkdir()
    members, lines, offset = [], [], 0
    for k in range(10):
        sample = []
        for ext, payload in (("cls", f"{k} {k + 1}".encode()), ("jpg", JPEG + bytes([k])),
                             ("json", json.dumps({"key": f"s{k}"}).encode()), ("txt", f"caption {k}".encode())):
            members += [member_header(f"s{k}.{ext}", len(payload)), payload, b"\0" * (-len(payload) % BLOCK)]
            sample.append(f"{ext} {offset + BLOCK} {len(payload)} s{k}.{ext}")
            offset += BLOCK + padded(len(payload))
        lines.append(" ".join(sample))
    (folder / "i-000000.tar").write_bytes(b"".join(members) + b"\0" * END_OF_ARCHIVE)
    (folder / "i-000000.idx").write_text(f"{IDX_VERSION} {N}\n" + "\n".join(lines[i % 10] for i in range(N)) + "\n",
                                         encoding="ascii")
    return str(folder / "i-000000.tar")


def test_the_fields_index_stays_on_disk_at_most_a_byte_a_record_in_each_process(tmp_path):
    """N records with a caption, metadata and multi-labels each: where their members are is indexed
    and memory-mapped like the images' (tests/formats/test_index_memory.py), never held per record."""
    pattern = write_image_text_shard(tmp_path / "shards")
    opener = lambda: ForeignShardsDataset(pattern, cache_dir=tmp_path / "cache")  # noqa: E731
    opener()  # indexed once; the measured open maps that index
    ds, held = open_read_and_batch(opener)
    assert held / N <= 1, f"{held / N:.1f} bytes a record held after the open, reads and first batch"
    assert len(pickle.dumps(ds)) / N <= 1
    assert ds.fields == ("text", "meta", "labels")
    k = int(first_batch()[0]) % 10
    assert ds.record(int(first_batch()[0])).fields == Fields(f"caption {k}", f'{{"key":"s{k}"}}', (k, k + 1))
    assert ds.record(N - 1).label == (N - 1) % 10 and len(first_batch()) == BATCH


def test_a_bad_caption_or_metadata_fails_its_record_in_one_line_and_the_loader_serves_around_it(tmp_path):
    """JSON nested past the recursion limit among them (it raised a RecursionError from record())."""
    shard = tmp_path / "shards/00000.tar"
    keys = list(write_field_cases(shard, more_good=12))
    ds = open_dataset(str(shard), cache_dir=tmp_path / "cache")
    bad = {keys.index(key): (key, *case) for key, case in BAD_FIELDS.items()}
    for index, (key, ext, _, reason) in bad.items():
        with pytest.raises(ValueError) as raised:
            ds.record(index)
        assert str(raised.value).startswith(f"{shard}: {key}.{ext} {reason}") and "\n" not in str(raised.value)
        assert ds[index].data == ds[0].data  # an image-and-label loader reads on
    loader = make_loader(str(shard), cache_dir=tmp_path / "cache", fields=("image", "text", "meta"),
                         on_error="skip", max_bad_fraction=0.5, **SMALL)
    served = {int(i): t for _, texts, _, indices in loader for i, t in zip(indices, texts)}
    assert not set(served) & set(bad) and len(served) == len(keys) - len(bad)
    assert sorted(b.index for b in loader.skipped) == sorted(bad)
    for b in loader.skipped:
        key, ext, _, reason = bad[b.index]
        assert b.reason.startswith(f"ValueError: {shard}: {key}.{ext} {reason}"), b.reason
