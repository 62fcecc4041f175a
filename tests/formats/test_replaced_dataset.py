"""A dataset re-converted in place under a loader (issue #34, finding 5) is never read under the
manifest the loader opened: the process that opens the data next (a fresh DataLoader worker, the
main process) ends the iteration with one DatasetReplaced line, under on_error="raise" and "skip"."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from converters import ConvertOptions, convert
from datapipe import make_loader
from datapipe.formats import DatasetReplaced, open_dataset
from tests.conftest import IMAGEFOLDER
from tests.processes import deadline

SMALL = dict(backend="dataloader", batch_size=4, image_size=32, device="cpu", train=False)
DEADLINE_S = 120


@pytest.fixture(scope="module")
def sources(clean_folder, tmp_path_factory) -> dict[str, Path]:
    """The clean fixture images (34 files, 30 usable), as three sources: the originals; the same count
    with other labels (cat renamed zebra: every label moves); and fewer files (the shrunken case)."""
    root = tmp_path_factory.mktemp("sources")
    same = root / "same"
    shutil.copytree(clean_folder, same)
    relabelled = root / "relabelled"
    shutil.copytree(clean_folder, relabelled)
    (relabelled / "train" / "cat").rename(relabelled / "train" / "zebra")
    (relabelled / "val" / "cat").rename(relabelled / "val" / "zebra")
    shrunk = root / "shrunk"
    shutil.copytree(clean_folder, shrunk)
    shutil.rmtree(shrunk / "train" / "dog")
    return {"same": same, "relabelled": relabelled, "shrunk": shrunk}


def packed(src: Path, dst: Path, *, overwrite: bool = False) -> Path:
    convert(src, dst, ConvertOptions(workers=1, progress=False, overwrite=overwrite, shard_bytes=64 << 10))
    return dst


def epoch(loader) -> list[list[int]]:
    return [batch.labels.tolist() for batch in loader]


def refused(loader, dst: Path) -> None:
    """The next epoch ends with one DatasetReplaced line naming `dst`."""
    try:
        epoch(loader)
    except DatasetReplaced as exc:
        # torch's iterator sits in the traceback's frames: dropped now, it stops its worker at once
        # (collected later by the garbage collector, it waits 5 s for it)
        exc.__traceback__ = None
        message = str(exc)
    else:
        raise AssertionError(f"the epoch over the replaced {dst} ended without DatasetReplaced")
    assert "\n" not in message, message
    assert message.startswith(f"the dataset at {dst} was replaced (re-converted)"), message
    assert "recreate the loader" in message


@pytest.mark.parametrize("suffix, start_method, on_error, replacement", [
    (".lmdb", "fork", "raise", "relabelled"),
    (".lmdb", "fork", "skip", "shrunk"),
    (".lmdb", "fork", "skip", "relabelled"),
    (".lmdb", "spawn", "raise", "shrunk"),
    (".h5", "fork", "raise", "shrunk"),
    (".h5", "fork", "skip", "relabelled"),
    (".wds", "fork", "raise", "relabelled"),
    (".wds", "fork", "skip", "shrunk"),
])
def test_fresh_worker_refuses_a_reconverted_dataset(sources, tmp_path, suffix, start_method, on_error, replacement):
    """The validation loader's case: persistent_workers=False starts a worker per epoch. The first
    epoch reads the dataset (not under spawn: one worker start is enough there); it is re-converted in
    place; the next epoch's worker opens the data and stops the iteration in one line (before: every
    batch changed silently, or a shrunken dataset gave a RuntimeError). No record is counted bad."""
    dst = packed(sources["same"], tmp_path / f"data{suffix}")
    loader = make_loader(dst, num_workers=1, persistent_workers=False, start_method=start_method, on_error=on_error,
                         **SMALL)
    with deadline(DEADLINE_S):
        if start_method == "fork":
            assert len(epoch(loader)) == len(loader)
        packed(sources[replacement], dst, overwrite=True)
        refused(loader, dst)
    assert loader.skipped == []


def test_reconverted_by_the_cli_before_the_first_read(sources, tmp_path):
    """`datapipe convert SRC DST --overwrite` in another process between open_dataset (the driver) and
    the worker's first open: the worker refuses; the driver's own read refuses too."""
    dst = packed(sources["same"], tmp_path / "data.lmdb")
    loader = make_loader(dst, num_workers=1, persistent_workers=False, on_error="skip", **SMALL)
    subprocess.run([sys.executable, "-m", "datapipe", "convert", str(sources["relabelled"]), str(dst), "--overwrite",
                    "--workers", "1", "--quiet"], check=True, timeout=DEADLINE_S, capture_output=True)
    with deadline(DEADLINE_S):
        refused(loader, dst)
        with pytest.raises(DatasetReplaced):
            loader.dataset[0]


@pytest.mark.parametrize("suffix", [".lmdb", ".h5", ".wds"])
def test_a_copy_of_the_same_output_is_the_same_dataset(sources, tmp_path, suffix):
    """The same output copied back over the path (new inodes, the same manifest) is still read, with
    the same batches; a re-conversion is not the dataset opened."""
    dst = packed(sources["same"], tmp_path / f"data{suffix}")
    backup = tmp_path / f"backup{suffix}"
    (shutil.copytree if dst.is_dir() else shutil.copy2)(dst, backup)
    loader = make_loader(dst, num_workers=1, persistent_workers=False, on_error="raise", **SMALL)
    with deadline(DEADLINE_S):
        first = epoch(loader)
        shutil.move(str(dst), str(tmp_path / "moved"))
        shutil.move(str(backup), str(dst))
        loader.set_epoch(0)
        assert epoch(loader) == first
        packed(sources["relabelled"], dst, overwrite=True)
        refused(loader, dst)


def test_resume_refuses_a_state_saved_over_other_records(sources, tmp_path):
    """A checkpoint's loader state names the records its position points at: after a re-conversion with
    other records at the path, load_state_dict refuses in one line; the same images converted again
    resume."""
    dst = packed(sources["same"], tmp_path / "data.lmdb")
    loader = make_loader(dst, num_workers=0, **SMALL)
    batches = iter(loader)
    next(batches)
    state = loader.state_dict()
    del batches
    packed(sources["same"], dst, overwrite=True)
    make_loader(dst, num_workers=0, **SMALL).load_state_dict(state)  # the same records: resumes
    packed(sources["relabelled"], dst, overwrite=True)
    with pytest.raises(ValueError, match=r"cannot resume: the state was saved over other records than .*data\.lmdb"):
        make_loader(dst, num_workers=0, **SMALL).load_state_dict(state)


def test_rewritten_foreign_shard_is_refused(foreign_shards, tmp_path):
    """Other tools' shards are indexed at open: a shard rewritten afterwards (another size or time) is
    refused where it is opened, not read through the old index."""
    import webdataset as wds

    folder = tmp_path / "shards"
    shutil.copytree(Path(foreign_shards).parent, folder)
    pattern = str(folder / Path(foreign_shards).name)
    loader = make_loader(pattern, num_workers=0, on_error="skip", **SMALL)
    with wds.TarWriter(str(folder / "foreign-000001.tar")) as sink:
        image = (IMAGEFOLDER / "train" / "fish" / "fish_000.jpg").read_bytes()
        sink.write({"__key__": "other", "jpg": image, "cls": "0"})
    with deadline(DEADLINE_S), pytest.raises(DatasetReplaced, match=r"foreign-000001\.tar was replaced or changed"):
        epoch(loader)
    assert loader.skipped == []


def test_a_foreign_shard_rewritten_in_place_with_its_size_and_mtime_kept_is_refused(foreign_shards, tmp_path):
    """The hard rewrite: same bytes count, modification time put back (cp -p, rsync -t, touch -r): the
    change time moved, so the shard is refused where it is opened (before: read through the old index)."""
    import os

    folder = tmp_path / "shards"
    shutil.copytree(Path(foreign_shards).parent, folder)
    pattern = str(folder / Path(foreign_shards).name)
    shard = folder / "foreign-000001.tar"
    loader = make_loader(pattern, num_workers=0, on_error="skip", **SMALL)
    before = os.stat(shard)
    blob = bytearray(shard.read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    shard.write_bytes(bytes(blob))
    os.utime(shard, ns=(before.st_atime_ns, before.st_mtime_ns))
    with deadline(DEADLINE_S), pytest.raises(DatasetReplaced, match=r"foreign-000001\.tar was replaced or changed"):
        epoch(loader)


def test_dali_source_workers_started_after_a_reconversion_refuse(sources, tmp_path):
    """DALI's source workers open the data in their own processes: re-converted between the loader's
    open and the pipeline's start, the epoch ends with the one DatasetReplaced line (before: DALI's
    report of a failed batch, blaming the records in flight)."""
    dst = packed(sources["same"], tmp_path / "data.lmdb")
    loader = make_loader(dst, **{**SMALL, "backend": "dali"}, num_workers=1, on_error="skip")
    packed(sources["relabelled"], dst, overwrite=True)
    with deadline(DEADLINE_S):
        refused(loader, dst)
    assert loader.skipped == []
