"""A source file rewritten with the same size between an interrupted conversion and `--resume` (the
task list, which pins names and sizes, still matches): the result never mixes old and new bytes. `.wds`
builds the shards holding such a file again; LMDB and HDF5 refuse in one line naming the file.
A rewrite that keeps the mtime (`cp -p`, `rsync -t`) counts too; a file only touched does not."""
import os
import shutil
from pathlib import Path

import pytest

from converters import ConvertError, ConvertOptions, Task, convert, list_tasks
from converters import sources
from converters.members import ArchiveMember
from converters.tasks import shard_jobs
from converters.sources import RACY_NS, changed_files, fingerprint, read_stat
from datapipe import open_dataset
from datapipe.formats import staging_path
from datapipe.formats.inspect import verify
from datapipe.records import record_digest
from tests.conftest import IMAGEFOLDER
from tests.converters.faults import deadline
from tests.converters.stopping import after_checkpoint, after_shards, kill_convert_when_stopped
from tests.converters.test_resume import _content

SHARD = 64 << 10



def is_jfif(path: str) -> bool:
    return Path(path).read_bytes()[6:11] == b"JFIF\0"


def rewrite(path: Path, *, keep_mtime: bool) -> None:
    """Same size, other bytes, still a valid JPEG: the JFIF header's X density changes. In place (the
    same inode, as `cp -p` over a file); with `keep_mtime` the mtime is set back, as `cp -p` does."""
    before = path.stat()
    data = bytearray(path.read_bytes())
    data[15] ^= 0x02
    with open(path, "r+b") as fh:
        fh.write(data)
    if keep_mtime:
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    assert after.st_size == before.st_size and (after.st_mtime_ns == before.st_mtime_ns or not keep_mtime)


def round_trips(dst: Path, src: Path, victim: Path) -> None:
    """`verify` passes, the rewritten file's record holds its current bytes, and the whole dataset
    equals a clean conversion of the source as it is now."""
    report = verify(dst, progress=False)
    assert report.ok, report.problems
    ds = open_dataset(dst, "train")
    stored = {ds.record(i).path: ds.record(i).data for i in range(len(ds))}
    assert stored[str(victim.relative_to(src))] == victim.read_bytes(), "the old bytes of the rewritten file"
    clean = dst.with_name("clean" + dst.suffix)
    convert(src, clean, ConvertOptions(progress=False, workers=1, shard_bytes=SHARD))
    assert _content(dst) == _content(clean)


@pytest.mark.parametrize("keep_mtime", [False, True], ids=["new-mtime", "mtime-kept"])
def test_wds_resume_builds_again_the_shard_of_a_file_rewritten_with_the_same_size(source, tmp_path, keep_mtime):
    dst = tmp_path / "out.wds"
    with deadline():
        kill_convert_when_stopped(["convert", str(source), str(dst), "--workers", "2", "--shard-size", "64KiB",
                                   "-q"], after_shards(1))
    staging = staging_path(dst)
    built = [job for job in shard_jobs(list_tasks(source, shuffle_seed=0), SHARD)
             if (staging / f"{job.name}.records.json").exists()]
    victim = next(task for job in built for task in job.tasks if is_jfif(task.path))
    rewrite(Path(victim.path), keep_mtime=keep_mtime)

    convert(source, dst, ConvertOptions(progress=False, resume=True, workers=1, shard_bytes=SHARD))
    round_trips(dst, source, Path(victim.path))


def test_lmdb_resume_refuses_a_file_rewritten_with_its_mtime_kept_and_takes_it_back_unchanged(source, tmp_path):
    dst = tmp_path / "out.lmdb"
    with deadline():
        kill_convert_when_stopped(["convert", str(source), str(dst), "--workers", "2", "--checkpoint-every", "4",
                                   "-q"], after_checkpoint(4))
    victim = next(Path(t.path) for t in list_tasks(source).tasks[:4] if is_jfif(t.path))
    original = victim.read_bytes()
    rewrite(victim, keep_mtime=True)
    options = ConvertOptions(progress=False, resume=True, workers=1)
    with pytest.raises(ConvertError, match=rf"1 source file\(s\) changed since the interrupted conversion packed "
                                           rf"them \({victim}\); --overwrite converts again from the start"):
        convert(source, dst, options)
    assert staging_path(dst).is_dir() and not dst.exists()

    victim.write_bytes(original)  # the same bytes again: its stat moved, its digest did not
    convert(source, dst, options)
    round_trips(dst, source, victim)


def settled_and_racy(path: str, key: str) -> tuple[str, str]:
    """The fingerprints of `path` read long after its last change, and within the same second."""
    raw, st = read_stat(path)
    digest = record_digest(key, 0, raw)
    return fingerprint(st, digest, st.st_ctime_ns + 2 * RACY_NS), fingerprint(st, digest, st.st_ctime_ns)


def test_a_file_is_read_again_only_when_its_stat_moved(tmp_path, monkeypatch):
    """Size, mtime, ctime and inode unchanged: no read. Touched: read, and unchanged. Rewritten with
    the mtime kept: changed. Read within a second of its last change: read again at every check."""
    path = tmp_path / "a.jpg"
    shutil.copy(IMAGEFOLDER / "train/cat/cat_000.jpg", path)
    task = Task("train", str(path), "a.jpg", "a", 0)
    settled, racy = settled_and_racy(str(path), "a")
    reads, digest = [], sources._digest
    monkeypatch.setattr(sources, "_digest", lambda t: reads.append(t.path) or digest(t))

    assert changed_files([task, task], [settled, racy]) == [] and reads == [str(path)]
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    assert changed_files([task], [settled]) == [] and len(reads) == 2
    rewrite(path, keep_mtime=True)
    assert changed_files([task, task], [settled, racy]) == [str(path)] * 2


def test_an_archive_member_is_checked_through_its_archive_and_by_its_own_bytes(tmp_path):
    """ImageNet's tars: a change elsewhere in the archive leaves a member unchanged; one inside it shows."""
    image = (IMAGEFOLDER / "train/cat/cat_000.jpg").read_bytes()
    archive = tmp_path / "train.tar"
    archive.write_bytes(b"\0" * 512 + image + b"\0" * 512)
    member = ArchiveMember(f"{archive}:cat_000.jpg", str(archive), 512, len(image))
    task = Task("train", member, "cat/cat_000.jpg", "cat_000", 0)
    settled, _ = settled_and_racy(member, "cat_000")
    assert changed_files([task], [settled]) == []

    with open(archive, "r+b") as fh:
        fh.write(b"\1")  # before the member: the archive's stat moved, the member's bytes did not
    assert changed_files([task], [settled]) == []
    with open(archive, "r+b") as fh:
        fh.seek(512 + 15)
        fh.write(bytes([image[15] ^ 2]))
    assert changed_files([task], [settled]) == [member]
