"""kill -9 in the middle of a conversion, then --resume: the result equals a clean run's, exactly."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from converters import ConvertError, ConvertOptions, convert
from datapipe import open_dataset, read_manifest
from datapipe.formats import staging_path
from tests.conftest import IMAGEFOLDER

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


def _kill_midway(src: Path, dst: Path, extra: list[str]) -> int:
    cmd = [sys.executable, "-m", "datapipe", "convert", str(src), str(dst), "--workers", "2",
           "--checkpoint-every", "40", "-q", *extra]
    proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    progress = staging_path(dst) / "progress.json"
    deadline = time.monotonic() + 60
    done = 0
    while done < 120 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.005)
        try:
            done = json.loads(progress.read_text())["done"]
        except (OSError, ValueError):
            pass
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    return done


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

    done = _kill_midway(big_source, dst, extra)
    assert 0 < done < 1000, f"the kill came at {done} files; the test needs it midway"
    assert not dst.exists()
    with pytest.raises(ValueError, match=r"interrupted.*--resume"):
        open_dataset(dst)
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
