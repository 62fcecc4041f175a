"""A worker process killed in the middle of a conversion (the OOM killer sends SIGKILL) ends the run
within a deadline, in one line naming what it was doing; --resume then finishes it to a clean run's
result. The local engine's workers still count every file for the bar and each marks itself as
forking nothing."""
import os

import pytest

from converters import ConvertOptions, convert, list_tasks
from converters.engines.local import LocalEngine
from converters.tasks import shard_jobs
from converters.shards import ShardContext
from converters.targets import FolderTarget
from datapipe.formats import staging_path
from tests.conftest import IMAGEFOLDER
from tests.converters.faults import deadline, kill_mid_shard, kill_reading, run_datapipe
from tests.converters.test_failures import one_line_error
from tests.converters.test_resume import _content

OPTIONS = ["--workers", "2", "--shard-size", "64KiB", "--checkpoint-every", "4", "-q"]


@pytest.fixture(autouse=True)
def _deadline():
    """Every test here runs worker processes: none may hang the suite."""
    with deadline():
        yield



def victim_shard() -> str:
    """A shard of at least three files that is not the first to start."""
    jobs = shard_jobs(list_tasks(IMAGEFOLDER, shuffle_seed=0), 64 << 10)
    return next(job.name for job in jobs[1:] if len(job.tasks) >= 3)


@pytest.mark.parametrize("suffix", [".lmdb", ".h5", ".wds"])
def test_a_worker_killed_mid_conversion_ends_it_in_one_line_and_resume_finishes_it(tmp_path, suffix):
    dst = tmp_path / f"out{suffix}"
    if suffix == ".wds":
        shard = victim_shard()
        prelude, doing = kill_mid_shard(shard, files=2), f"building shard {shard}"
    else:
        prelude, doing = kill_reading("train/dog/dog_002.jpg"), f"reading {IMAGEFOLDER / 'train/dog/dog_002.jpg'}"
    args = ["convert", str(IMAGEFOLDER), str(dst), *OPTIONS]
    message = one_line_error(run_datapipe(args, prelude))
    assert f"a worker process died while {doing}" in message
    assert f"kept in {staging_path(dst)}" in message and "--resume" in message
    assert staging_path(dst).is_dir() and not dst.exists()

    resumed = run_datapipe([*args, "--resume"])
    assert resumed.returncode == 0, resumed.stderr
    clean = tmp_path / f"clean{suffix}"
    convert(IMAGEFOLDER, clean, ConvertOptions(progress=False, workers=1, shard_bytes=64 << 10))
    assert _content(dst) == _content(clean)
    if suffix == ".wds":
        shards = sorted(p.name for p in clean.iterdir() if p.suffix in (".tar", ".idx"))
        assert shards == sorted(p.name for p in dst.iterdir() if p.suffix in (".tar", ".idx"))
        assert all((dst / name).read_bytes() == (clean / name).read_bytes() for name in shards)


def test_local_workers_count_every_file_and_fork_nothing(tmp_path, monkeypatch):
    import converters.engines.local as local
    from datapipe.storage.isolate import may_fork_workers

    build = local.build_shard

    def marking(job, ctx, tick=None):
        (tmp_path / f"{job.name}.{os.getpid()}.{int(may_fork_workers())}").touch()
        return build(job, ctx, tick)

    monkeypatch.setattr(local, "build_shard", marking)
    task_list = list_tasks(IMAGEFOLDER, shuffle_seed=0)
    jobs = shard_jobs(task_list, 64 << 10)
    (tmp_path / "out").mkdir()
    ctx = ShardContext(FolderTarget(tmp_path / "out"), ConvertOptions().checks, task_list.fingerprint, {})
    ticks = []
    built = list(LocalEngine(2).run(jobs, ctx, lambda files, nbytes: ticks.append((files, nbytes))))
    assert sorted(r.name for r in built) == [j.name for j in jobs]
    assert sum(f for f, _ in ticks) == len(task_list.tasks) and sum(b for _, b in ticks) == sum(r.data_bytes for r in built)
    marks = [p.name.split(".") for p in tmp_path.glob("*.*.*")]
    assert sorted(m[0] for m in marks) == [j.name for j in jobs]
    assert {m[2] for m in marks} == {"0"} and str(os.getpid()) not in {m[1] for m in marks}
