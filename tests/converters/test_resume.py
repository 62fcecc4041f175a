"""kill -9 in the middle of a conversion, then --resume: the result equals a clean run's, exactly."""
import json
import shutil
from pathlib import Path

import pytest

from converters import ConvertError, ConvertOptions, convert, list_tasks
from datapipe import open_dataset, read_manifest
from datapipe.formats import staging_path
from tests.conftest import IMAGEFOLDER
from tests.converters.stopping import after_checkpoint, after_shards, kill_convert_when_stopped

FILES_PER_CLASS = 300


@pytest.fixture(scope="module")
def big_source(tmp_path_factory) -> Path:
    """900 small real images (fixture copies) plus the fixture's bad files, in train and val."""
    root = tmp_path_factory.mktemp("big")
    goods = sorted((IMAGEFOLDER / "train").rglob("*_00[0-4].jpg"))
    for split in ("train", "val"):
        for c, cls in enumerate(("cat", "dog", "fish")):
            (root / split / cls).mkdir(parents=True)
            for i in range(FILES_PER_CLASS if split == "train" else 20):
                shutil.copy(goods[(i + c) % len(goods)], root / split / cls / f"{cls}_{i:04d}.jpg")
    shutil.copy(IMAGEFOLDER / "train/cat/truncated.jpg", root / "train/cat/zz_truncated.jpg")
    shutil.copy(IMAGEFOLDER / "train/dog/empty.jpg", root / "val/dog/zz_empty.jpg")
    return root


def _kill_midway(src: Path, dst: Path, extra: list[str]) -> float:
    """Kill the conversion after 3 shards (.wds) or its checkpoint past 120 files; returns the part done."""
    args = ["convert", str(src), str(dst), "--workers", "2", "--checkpoint-every", "40", "-q", *extra]
    kill_convert_when_stopped(args, after_shards(3) if dst.suffix == ".wds" else after_checkpoint(120))
    staging = staging_path(dst)
    if dst.suffix == ".wds":
        return len(list(staging.glob("*.records.json"))) / len(list((dst.parent / "clean.wds").glob("*.tar")))
    return json.loads((staging / "progress.json").read_text())["done"] / len(list_tasks(src).tasks)


def _content(path: Path) -> dict:
    manifest = read_manifest(path)
    out = {"splits": {s: (i.samples, i.bytes, i.digest, i.skipped, i.shards) for s, i in manifest.splits.items()}}
    for split in manifest.splits:
        ds = open_dataset(path, split)
        out[split] = [ds.record(i) for i in range(len(ds))]
    return out


@pytest.mark.parametrize("suffix", [".lmdb", ".h5", ".wds"])
def test_killed_conversion_is_refused_then_resumed_to_the_clean_result(big_source, tmp_path, suffix):
    extra = ["--shard-size", "128KiB"] if suffix == ".wds" else []
    clean, dst = tmp_path / f"clean{suffix}", tmp_path / f"resumed{suffix}"
    convert(big_source, clean, ConvertOptions(progress=False, shard_bytes=128 << 10))

    part = _kill_midway(big_source, dst, extra)
    assert 0 < part < 1, f"the kill came at {part:.0%} of the work; the test needs it midway"
    assert not dst.exists()
    for path in (dst, staging_path(dst), str(staging_path(dst))):  # the staging folder (.wds: tars) is no dataset
        with pytest.raises(ValueError, match=r"interrupted.*--resume"):
            open_dataset(path)
    with pytest.raises(ConvertError, match="--resume"):
        convert(big_source, dst, ConvertOptions(progress=False, shard_bytes=128 << 10))
    with pytest.raises(ConvertError, match="other options"):
        convert(big_source, dst, ConvertOptions(progress=False, resume=True, resize_max=64, shard_bytes=128 << 10))

    convert(big_source, dst, ConvertOptions(progress=False, resume=True, shard_bytes=128 << 10))
    assert not staging_path(dst).exists()
    assert _content(dst) == _content(clean)
    if suffix == ".wds":  # fixed mtime and order: the shards are byte-identical
        for tar in sorted(clean.glob("*.tar")) + sorted(clean.glob("*.idx")):
            assert (dst / tar.name).read_bytes() == tar.read_bytes()
