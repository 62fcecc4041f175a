"""Records with fields beside image and label (a caption, JSON metadata, multi-labels) come back byte-exact
from every packed format, through the Writer API and through `datapipe convert`; records without fields
are stored as before; `verify` names a record whose caption was altered; an HDF5 split's field columns
cost a reader no private memory per record."""
from __future__ import annotations

import dataclasses
import json
import pickle
import shutil
import tarfile
import tracemalloc
from pathlib import Path

import h5py
import pytest

from converters import ConvertOptions, convert, list_tasks
from converters.tasks import record_bytes, shard_jobs
from datapipe import open_dataset, read_manifest
from datapipe.formats import FORMATS
from datapipe.formats.hdf5 import MANIFEST_ATTR, _SplitBuilder
from datapipe.formats.tar import BLOCK
from datapipe.formats.wds import ShardFile
from datapipe.formats.inspect import verify
from datapipe.records import NO_FIELDS, Fields, Manifest, Record, SplitInfo, canonical_meta, record_digest
from datapipe.order.sharding import EpochOrder
from tests.conftest import IMAGEFOLDER
from tests.fields_data import expected_fields, write_caption_folder

pytestmark = pytest.mark.forked  # tracemalloc in a child with one thread (tests/forked.py)

CLASSES = ["cat", "dog", "fish"]
SUFFIX = {"lmdb": ".lmdb", "hdf5": ".h5", "wds": ".wds"}
JPEG = (IMAGEFOLDER / "train/cat/cat_000.jpg").read_bytes()
FIELDS = [
    Fields("a caption", canonical_meta({"b": [1, None], "a": "é"}), (0, 2)),
    Fields(""),  # an empty caption is a caption
    NO_FIELDS,
    Fields("ünïcødé 猫 🐱\x00 after a NUL\n", None, (1,)),  # kept byte for byte, trailing newline too
    Fields(None, None, ()),  # multi-label with no label: record label -1
    Fields(None, canonical_meta('{"url": "http://x.example/a b.jpg", "n": 3}')),
]
HDF5_PLAIN_COLUMNS = {"blob", "offsets", "labels", "keys", "paths", "sha256"}


def make_record(i: int, fields: Fields = NO_FIELDS) -> Record:
    key, data = f"r{i:06d}", JPEG + i.to_bytes(4, "little")  # bytes only: nothing decodes here
    label = (fields.labels[0] if fields.labels else -1) if fields.labels is not None else i % 3
    return Record(key, data, label, f"c/{key}.jpg", record_digest(key, label, data, fields), fields)


def write_with_writer(fmt: str, root: Path) -> tuple[Path, dict[str, list[Record]]]:
    """Train records with every kind of field (and some without), val records without any, written
    through the format's Writer as the converter does; the dataset's path."""
    splits = {"train": [make_record(i, f) for i, f in enumerate(FIELDS)],
              "val": [make_record(100 + i) for i in range(3)]}
    staging = root / f"out{SUFFIX[fmt]}"
    writer = FORMATS[fmt].writer(staging, size_hint=1 << 20, shard_bytes=1 << 20)
    infos = {split: SplitInfo() for split in splits}
    for split, records in splits.items():
        for record in records:
            writer.write(split, infos[split].samples, record)
            infos[split].add(record)
    writer.close(Manifest(fmt, CLASSES, infos))
    return writer.payload, splits


@pytest.mark.parametrize("fmt", sorted(SUFFIX))
def test_the_writer_stores_and_returns_every_field_byte_exact(fmt, tmp_path):
    path, splits = write_with_writer(fmt, tmp_path)
    assert read_manifest(path).splits["train"].fields == ["text", "meta", "labels"]
    for split, records in splits.items():
        ds = open_dataset(path, split)
        assert ds.fields == (("text", "meta", "labels") if split == "train" else ())
        assert [ds.record(i) for i in range(len(ds))] == records  # key, bytes, label, path, digest and fields
        assert [ds[i] for i in range(len(ds))] == [r.sample for r in records]
        assert [pickle.loads(pickle.dumps(ds)).record(i) for i in range(len(ds))] == records  # a worker's copy
    assert verify(path, progress=False).ok
    if fmt == "hdf5":  # a split without fields has the columns it always had
        with h5py.File(path) as f:
            assert set(f["val"]) == HDF5_PLAIN_COLUMNS and HDF5_PLAIN_COLUMNS < set(f["train"])


def shard_samples(folder: Path) -> dict[str, dict[str, bytes]]:
    """key -> {ext: bytes} of every sample in a .wds folder's shards, read with tarfile."""
    out: dict[str, dict[str, bytes]] = {}
    for shard in sorted(folder.glob("*.tar")):
        with tarfile.open(shard) as tar:
            for m in tar.getmembers():
                key, ext = m.name.split(".", 1)
                out.setdefault(key, {})[ext] = tar.extractfile(m).read()
    return out


def test_a_wds_caption_is_a_standard_txt_member_and_a_record_without_one_is_as_before(tmp_path):
    path, splits = write_with_writer("wds", tmp_path)
    samples = shard_samples(path)
    for record in splits["train"] + splits["val"]:
        members = samples[record.key]
        meta = json.loads(members["json"])
        if record.fields.text is None:
            assert "txt" not in members
        else:
            assert members["txt"] == record.fields.text.encode("utf-8")  # what webdataset/open_clip read
        if record.fields:
            caption = {"txt"} if record.fields.text is not None else set()
            assert set(members) == {"cls", "jpg", "i64", "json"} | caption
            assert Fields.from_json(meta["fields"]) == record.fields
        else:  # the four members, the JSON of before
            assert list(members) == ["cls", "jpg", "i64", "json"] and set(meta) == {"key", "label", "path", "sha256"}


def test_the_webdataset_library_and_dali_read_our_captions(tmp_path):
    import webdataset as wds
    from nvidia.dali import fn, pipeline_def, types

    path, splits = write_with_writer("wds", tmp_path)
    want = {r.key: r for r in splits["train"]}
    names = [s["name"] for s in open_dataset(path).shard_entries()]
    got = {s["__key__"]: s for s in wds.WebDataset([str(path / n) for n in names], shardshuffle=False)}
    assert {k: s.get("txt") for k, s in got.items()} == {
        k: None if r.fields.text is None else r.fields.text.encode() for k, r in want.items()}

    @pipeline_def(batch_size=len(want), num_threads=1, device_id=None)
    def pipe():
        return tuple(fn.readers.webdataset(
            paths=[str(path / n) for n in names], index_paths=[str(path / n.replace(".tar", ".idx")) for n in names],
            ext=["jpg;png", "json", "txt"], dtypes=[types.UINT8] * 3, missing_component_behavior="empty",
            name="reader"))

    p = pipe()
    p.build()
    images, metas, texts = p.run()
    for i in range(len(want)):
        record = want[json.loads(bytes(metas.at(i)).decode())["key"]]
        assert bytes(images.at(i)) == record.data
        assert bytes(texts.at(i)) == (record.fields.text or "").encode()


@pytest.fixture(scope="module")
def captions(tmp_path_factory) -> Path:
    return write_caption_folder(tmp_path_factory.mktemp("captions") / "src")


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("fmt", sorted(SUFFIX))
def test_convert_stores_each_images_caption_and_metadata(captions, tmp_path, fmt, workers):
    dst = tmp_path / f"out{SUFFIX[fmt]}"
    report = convert(captions, dst, ConvertOptions(progress=False, workers=workers, shard_bytes=64 << 10))
    manifest = read_manifest(dst)
    assert fmt != "wds" or manifest.splits["train"].shard_count == 2  # the shards' record lists merged
    assert {s: i.fields for s, i in manifest.splits.items()} == {"train": ["text", "meta"], "val": ["text"]}
    assert all(not i.skipped for i in report.splits.values())
    for split in ("train", "val"):
        ds = open_dataset(dst, split)
        assert ds.fields == tuple(manifest.splits[split].fields)
        records = [ds.record(i) for i in range(len(ds))]
        assert {r.path: r.fields for r in records} == {r.path: expected_fields(r.path) for r in records}
        assert len(records) == (12 if split == "train" else 2)
    assert verify(dst, progress=False).ok


def alter_caption(path: Path, fmt: str, old: bytes, new: bytes) -> None:
    """Rewrite a stored caption in place (as bit rot or a hand edit would), its digest left as it was."""
    assert len(old) == len(new)
    if fmt == "lmdb":
        import lmdb

        with lmdb.open(str(path), subdir=True) as env, env.begin(write=True) as txn:
            for key, value in list(txn.cursor()):
                if old in value:
                    txn.put(key, value.replace(old, new))
    else:  # HDF5: in its `text_values` column; .wds: in the .json and the .txt alike
        file = path if fmt == "hdf5" else path / "train-000000.tar"
        blob = file.read_bytes()
        assert blob.count(old) == (1 if fmt == "hdf5" else 2)
        file.write_bytes(blob.replace(old, new))


@pytest.mark.parametrize("fmt", sorted(SUFFIX))
def test_verify_names_the_record_whose_caption_was_altered(fmt, tmp_path):
    written, splits = write_with_writer(fmt, tmp_path)
    assert verify(written, progress=False).ok
    path = tmp_path / "altered" / written.name  # a copy: this process keeps the original open (LMDB: once a path)
    path.parent.mkdir()
    (shutil.copytree if written.is_dir() else shutil.copy)(written, path)
    alter_caption(path, fmt, b"a caption", b"a captiom")
    report = verify(path, progress=False)
    victim = splits["train"][0]
    assert not report.ok and any(f"key {victim.key}" in p and "checksum mismatch" in p for p in report.problems)


def test_a_wds_txt_member_that_disagrees_with_its_json_is_damage(tmp_path):
    path, splits = write_with_writer("wds", tmp_path)
    shard = path / "train-000000.tar"
    blob = shard.read_bytes()
    start = blob.index(b"a caption\0")  # the .txt member's bytes (the .json's are followed by a quote)
    shard.write_bytes(blob[:start] + b"A" + blob[start + 1:])
    report = verify(path, progress=False)
    assert not report.ok and "record 0: unreadable" in report.problems[0]
    assert f"{splits['train'][0].key}.txt is not the caption its .json holds" in report.problems[0]


def test_a_caption_is_planned_into_the_wds_shard_size(captions, tmp_path):
    """A sample's .txt member and its longer .json are counted when shards are cut (RECORD_OVERHEAD is
    the four members of a record without fields): planned bytes grow at least as much as the real ones."""
    task_list = list_tasks(captions)
    task = next(t for t in task_list.tasks if t.fields.text)
    bare = dataclasses.replace(task, fields=NO_FIELDS)
    assert record_bytes(bare) == bare.size + 7 * BLOCK  # as before
    grown = sample_size(tmp_path / "a", task) - sample_size(tmp_path / "b", bare)
    assert record_bytes(task) - record_bytes(bare) >= grown > BLOCK
    assert sum(job.planned_bytes for job in shard_jobs(task_list, 1 << 20)) == sum(map(record_bytes, task_list.tasks))


def sample_size(folder: Path, task) -> int:
    """The bytes of `task`'s sample in a shard, as our writer writes it."""
    folder.mkdir()
    data = Path(task.path).read_bytes()
    shard = ShardFile(folder, "train", 0)
    shard.add_record(0, Record(task.key, data, task.label, task.relpath,
                               record_digest(task.key, task.label, data, task.fields), task.fields))
    shard.file.close()
    return shard.offset


N = 100_000
BATCH = 32


def big_record(i: int) -> Record:
    """A tiny record with fields; its digest a stand-in (nothing verifies here), cheap to make 100k times."""
    key, data = f"r{i:08d}", b"\xff\xd8" + i.to_bytes(4, "little")
    fields = Fields(f"caption {i} ✓" if i % 3 else "", f'{{"i":{i}}}' if i % 2 else None,
                    (i % 10, (i + 3) % 10) if i % 5 else None)
    return Record(key, data, i % 10, f"c/{key}.jpg", f"{i:064x}", fields)


def test_an_hdf5_split_with_fields_costs_a_reader_no_private_byte_a_record(tmp_path):
    """As tests/formats/test_index_memory.py, with a caption, metadata and multi-labels on the records."""
    records = [big_record(i) for i in range(N)]
    info = SplitInfo(samples=N, bytes=sum(len(r.data) for r in records), fields=["text", "meta", "labels"])
    sizes = {"text": sum(len(r.fields.text.encode()) for r in records),
             "meta": sum(len(r.fields.meta or "") for r in records),
             "labels": sum(len(r.fields.labels or ()) for r in records)}
    path = tmp_path / "big.h5"
    with h5py.File(path, "w") as f:
        builder = _SplitBuilder(f, "train", info, sizes)
        for start in range(0, N, 20_000):
            builder.write(records[start:start + 20_000])
        builder.check_full()
        f.attrs[MANIFEST_ATTR] = Manifest("hdf5", [f"c{k}" for k in range(10)], {"train": info}).to_json()
    del records
    batch = [int(i) for i in EpochOrder(N, BATCH, seed=0).batches(0)[0]] + [0, N - 1]
    open_dataset(path)  # the modules imported outside the measure
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        ds = open_dataset(path)
        got = [ds.record(i) for i in batch]
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert got == [big_record(i) for i in batch]
    assert (held - before) / N <= 1, f"{(held - before) / N:.1f} bytes a record held after the open and reads"
    assert len(pickle.dumps(ds)) / N <= 1


@pytest.mark.parametrize("fmt", sorted(SUFFIX))
def test_metadata_with_a_lone_surrogate_escape_is_stored_not_a_failed_run(captions, tmp_path, fmt):
    src = tmp_path / "src"
    shutil.copytree(captions, src)
    (src / "train/cat/cat_000.json").write_text('{"exif": "\\ud800x", "name": "caf\\u00e9"}')  # valid JSON
    dst = tmp_path / f"out{SUFFIX[fmt]}"
    convert(src, dst, ConvertOptions(progress=False, shard_bytes=64 << 10))
    ds = open_dataset(dst)
    (record,) = [r for r in map(ds.record, range(len(ds))) if r.path == "train/cat/cat_000.jpg"]
    assert json.loads(record.fields.meta) == {"exif": "\ud800x", "name": "café"}
    assert verify(dst, progress=False).ok


def test_a_manifest_without_fields_is_written_as_before_fields_existed(tmp_path):
    convert(IMAGEFOLDER, tmp_path / "plain.lmdb", ConvertOptions(progress=False))
    body = json.loads((tmp_path / "plain.lmdb" / "manifest.json").read_text())
    assert all("fields" not in info for info in body["splits"].values())  # the datapipe before fields reads it
    assert read_manifest(tmp_path / "plain.lmdb").splits["train"].fields == []
