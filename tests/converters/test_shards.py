"""Shards fixed by the task list and written whole by parallel tasks: the cut, the record positions, a
shard of only bad files, and the same bytes for any number of workers."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from converters import ConvertOptions, convert, list_tasks
from converters.tasks import RECORD_OVERHEAD, shard_jobs
from datapipe import open_dataset, read_manifest
from datapipe.formats.wds import RecordPositions
from tests.conftest import IMAGEFOLDER


def test_shards_are_cut_by_input_size_in_write_order():
    task_list = list_tasks(IMAGEFOLDER, shuffle_seed=0)
    limit = 3 * (max(t.size for t in task_list.tasks) + RECORD_OVERHEAD)
    jobs = shard_jobs(task_list, limit)
    assert [t for j in jobs for t in j.tasks] == task_list.tasks  # every task once, in write order
    for split in task_list.splits:
        mine = [j for j in jobs if j.split == split]
        assert [j.number for j in mine] == list(range(len(mine)))
        assert [j.first for j in mine] == [sum(len(k.tasks) for k in mine[:n]) for n in range(len(mine))]
    assert all(j.planned_bytes <= limit for j in jobs)
    for a, b in zip(jobs, jobs[1:]):
        if a.split == b.split:  # a shard closes only when the next file would not fit
            assert a.planned_bytes + b.tasks[0].size + RECORD_OVERHEAD > limit
    single = shard_jobs(task_list, 1)  # every file larger than the limit: one shard each
    assert [len(j.tasks) for j in single] == [1] * len(task_list.tasks)


def test_positions_skip_the_slots_of_rejected_files():
    positions = RecordPositions([{"path": "a", "reason": "x", "position": p} for p in (0, 3, 4, 9)]
                                + [{"path": "notes.txt", "reason": "not an image"}])
    kept = [p for p in range(12) if p not in (0, 3, 4, 9)]
    assert [positions(i) for i in range(len(kept))] == kept
    assert [positions.index(p) for p in kept] == list(range(len(kept)))
    assert [RecordPositions([])(i) for i in range(3)] == [0, 1, 2]


@pytest.fixture
def junk_source(tmp_path) -> Path:
    """Good fixture images and two 100 KB junk files: at a 64 KiB shard size each junk file is a
    shard of its own, with nothing to keep."""
    root = tmp_path / "src"
    for cls in ("cat", "dog"):
        (root / "train" / cls).mkdir(parents=True)
        for good in sorted((IMAGEFOLDER / "train" / cls).glob(f"{cls}_00*.jpg")):
            shutil.copy(good, root / "train" / cls / good.name)
        (root / "train" / cls / "junk.jpg").write_bytes(b"\x00junk" * 20_000)
    return root


def test_a_shard_of_only_bad_files_is_left_out_and_positions_stay_right(junk_source, tmp_path):
    dst = tmp_path / "out.wds"
    report = convert(junk_source, dst, ConvertOptions(progress=False, workers=2, shard_bytes=64 << 10))
    info = read_manifest(dst).splits["train"]
    assert report.skipped == 2 and {s["path"] for s in info.skipped} == {"train/cat/junk.jpg", "train/dog/junk.jpg"}
    names = [s["name"] for s in open_dataset(dst).shard_entries()]  # a gap where the junk shards were
    assert sorted(p.name for p in dst.glob("*.tar")) == names and len(names) < len(shard_jobs(
        list_tasks(junk_source, shuffle_seed=0), 64 << 10))
    assert not list(dst.glob("*.records.json")) and not list(dst.glob(".building-*"))
    ds = open_dataset(dst)
    records = [ds.record(i) for i in range(len(ds))]  # each read checks the .i64 position
    assert sorted(r.path for r in records) == sorted(str(p.relative_to(junk_source)) for p in
                                                     junk_source.rglob("*_00*.jpg"))


@pytest.mark.parametrize("workers", [2, 3])
def test_the_bytes_do_not_depend_on_the_workers(workers, tmp_path):
    one, many = tmp_path / "one.wds", tmp_path / f"w{workers}.wds"
    convert(IMAGEFOLDER, one, ConvertOptions(progress=False, workers=1, shard_bytes=64 << 10))
    convert(IMAGEFOLDER, many, ConvertOptions(progress=False, workers=workers, shard_bytes=64 << 10))
    files = sorted(p.name for p in one.iterdir() if p.name != "manifest.json")
    assert files == sorted(p.name for p in many.iterdir() if p.name != "manifest.json") and len(files) > 4
    assert all((one / f).read_bytes() == (many / f).read_bytes() for f in files)


def test_record_lists_arriving_in_any_order_merge_in_shard_order(tmp_path):
    from converters.sharded import Merger
    from converters.shards import ShardRecords
    from converters.targets import FolderTarget

    task_list = list_tasks(IMAGEFOLDER, shuffle_seed=0)
    jobs = shard_jobs(task_list, 64 << 10)
    shard = {"bytes": 4096, "sha256": "0" * 64}
    lists = [ShardRecords(j.name, j.split, task_list.fingerprint, {},
                          {"name": j.name + ".tar", "samples": len(j.tasks), **shard},
                          [f"{j.name}-{k}" for k in range(len(j.tasks))], list(range(len(j.tasks))), 10)
             for j in jobs]
    merged = []
    for order, folder in ((lists, "in-order"), (lists[::-1], "reversed")):
        (tmp_path / folder).mkdir()
        merger = Merger(task_list, jobs)
        for records in order:
            merger.add(records)
        merged.append(merger.finish(FolderTarget(tmp_path / folder)))
        assert not merger.waiting
    assert merged[0] == merged[1] and len(jobs) > 2
