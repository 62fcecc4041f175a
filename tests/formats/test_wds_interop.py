"""Our shards are plain WebDataset: the `webdataset` library and DALI's readers.webdataset read them."""
import json

import pytest

from converters import ConvertOptions, convert
from datapipe import open_dataset, read_manifest
from tests.conftest import IMAGEFOLDER


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    dst = tmp_path_factory.mktemp("wds") / "fixture.wds"
    convert(IMAGEFOLDER, dst, ConvertOptions(progress=False, workers=1, shard_bytes=64 << 10))
    names = [s["name"] for s in open_dataset(dst).shard_entries()]
    assert len(names) >= 2
    ds = open_dataset(dst, "train")
    return dst, names, {ds.record(i).key: ds.record(i) for i in range(len(ds))}


def test_webdataset_library_reads_every_sample(shards):
    import webdataset as wds

    dst, names, want = shards
    got = list(wds.WebDataset([str(dst / n) for n in names], shardshuffle=False))
    assert sorted(s["__key__"] for s in got) == sorted(want)
    for s in got:
        rec = want[s["__key__"]]
        image = s.get("jpg", s.get("png"))
        assert image == rec.data and int(s["cls"]) == rec.label
        assert json.loads(s["json"])["path"] == rec.path


def test_dali_readers_webdataset_reads_every_sample_with_our_index(shards):
    from nvidia.dali import fn, pipeline_def, types

    dst, names, want = shards

    @pipeline_def(batch_size=4, num_threads=1, device_id=None)
    def pipe():
        return tuple(fn.readers.webdataset(
            paths=[str(dst / n) for n in names], index_paths=[str(dst / n.replace(".tar", ".idx")) for n in names],
            ext=["jpg;png", "cls", "i64", "json"], dtypes=[types.UINT8, types.UINT8, types.INT64, types.UINT8],
            missing_component_behavior="error", name="reader"))

    p = pipe()
    p.build()
    assert p.epoch_size("reader") == len(want)
    seen = []
    while len(seen) < len(want):
        images, labels, ids, metas = p.run()
        for i in range(len(images)):
            meta = json.loads(bytes(metas.at(i)).decode())
            rec = want[meta["key"]]
            assert bytes(images.at(i)) == rec.data and int(bytes(labels.at(i)).decode()) == rec.label
            position, label = ids.at(i).tolist()  # a record's position: its index, past skipped files
            ds = open_dataset(dst, "train")
            assert label == rec.label and ds.record(ds.positions.index(position)).key == meta["key"]
            seen.append(meta["key"])
    assert sorted(seen[: len(want)]) == sorted(want)


@pytest.mark.parametrize("name, size", [("a.cls", 1), ("cat_n0144_0001.jpg", 123_456), ("x" * 95 + ".json", 0)])
def test_our_ustar_header_is_the_one_tarfile_writes(name, size):
    import tarfile

    from datapipe.formats.tar import MTIME, member_header

    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = size, MTIME, 0o644
    assert member_header(name, size) == info.tobuf(format=tarfile.USTAR_FORMAT)
