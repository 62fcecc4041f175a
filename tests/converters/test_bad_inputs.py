"""Inputs that cannot be read are bad files like any other: a dangling symlink, a file that vanished
after the scan, a file without read permission. Each is skipped and listed with its reason, the run
goes on, and --strict stops at it in one line. An I/O error (the disk's, not the file's) stops the
run, on the input side as on the output side, and keeps the finished part for --resume."""
import ctypes
import os
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import converters.pack
from converters import ConvertError, ConvertOptions, convert
from datapipe import open_dataset, read_manifest
from datapipe.formats import staging_path
from tests.conftest import IMAGEFOLDER
from tests.converters.faults import deadline, run_datapipe
from tests.converters.test_failures import one_line_error

SUFFIXES = [".lmdb", ".h5", ".wds"]
PACKED = {".lmdb": "packed_lmdb", ".h5": "packed_hdf5", ".wds": "packed_wds"}
OPTIONS = ["--shard-size", "64KiB", "-q"]


@pytest.fixture(autouse=True)
def _deadline():
    """Every test here runs worker processes: none may hang the suite."""
    with deadline():
        yield




def by_key(path: Path) -> dict:
    ds = open_dataset(path)
    return {r.key: r for r in (ds.record(i) for i in range(len(ds)))}


def skipped(path: Path) -> dict[str, str]:
    return {s["path"]: s["reason"] for s in read_manifest(path).splits["train"].skipped}


@pytest.mark.parametrize("workers", ["1", "2"])
@pytest.mark.parametrize("suffix", SUFFIXES)
def test_a_dangling_symlink_is_skipped_with_its_reason(request, source, tmp_path, suffix, workers):
    (source / "train/cat/broken.JPEG").symlink_to(tmp_path / "deduplicated/away.JPEG")
    dst = tmp_path / f"out{suffix}"
    done = run_datapipe(["convert", str(source), str(dst), "--workers", workers, *OPTIONS])
    assert done.returncode == 0, done.stderr
    assert "skipped train/cat/broken.JPEG: dangling symlink" in done.stdout
    assert skipped(dst)["train/cat/broken.JPEG"] == f"dangling symlink (to {tmp_path / 'deduplicated/away.JPEG'})"
    assert by_key(dst) == by_key(request.getfixturevalue(PACKED[suffix]))  # everything else, as without it


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_strict_stops_at_a_dangling_symlink_in_one_line(source, tmp_path, suffix):
    (source / "train/dog/broken.JPEG").symlink_to("nowhere.JPEG")
    dst = tmp_path / f"out{suffix}"
    done = run_datapipe(["convert", str(source), str(dst), "--workers", "2", "--strict", *OPTIONS])
    message = one_line_error(done)
    assert "broken.JPEG: dangling symlink (to nowhere.JPEG) (--strict stops at the first bad file)" in message
    assert not dst.exists() and not staging_path(dst).exists()


def vanish_after_the_scan(monkeypatch, source: Path) -> None:
    """Once the task list is made: delete one file, and the target of a symlink that was whole."""
    (source / "elsewhere").mkdir()
    shutil.move(source / "train/cat/cat_003.jpg", source / "elsewhere/cat_003.jpg")
    (source / "train/cat/cat_003.jpg").symlink_to(source / "elsewhere/cat_003.jpg")
    list_tasks = converters.pack.list_tasks

    def listed_then_gone(*args, **kwargs):
        task_list = list_tasks(*args, **kwargs)
        (source / "train/dog/dog_001.jpg").unlink()
        (source / "elsewhere/cat_003.jpg").unlink()
        return task_list

    monkeypatch.setattr(converters.pack, "list_tasks", listed_then_gone)


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("suffix", SUFFIXES)
def test_a_file_that_vanishes_after_the_scan_is_skipped(monkeypatch, request, source, tmp_path, suffix, workers):
    vanish_after_the_scan(monkeypatch, source)
    dst = tmp_path / f"out{suffix}"
    report = convert(source, dst, ConvertOptions(progress=False, workers=workers, shard_bytes=64 << 10))
    reasons = skipped(dst)
    assert reasons["train/dog/dog_001.jpg"] == "file vanished after the scan"
    assert reasons["train/cat/cat_003.jpg"] == f"dangling symlink (to {source / 'elsewhere/cat_003.jpg'})"
    assert report.skipped == len(reasons) == 6  # the fixture's four bad files and these two
    packed = by_key(request.getfixturevalue(PACKED[suffix]))
    assert by_key(dst) == {k: r for k, r in packed.items() if r.path not in reasons}


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_strict_stops_at_a_file_that_vanished_after_the_scan(monkeypatch, source, tmp_path, suffix):
    for bad in ("train/cat/truncated.jpg", "train/dog/empty.jpg", "train/dog/text.jpg", "train/fish/bomb.png"):
        (source / bad).unlink()
    vanish_after_the_scan(monkeypatch, source)
    dst = tmp_path / f"out{suffix}"
    with pytest.raises(ConvertError, match=r"(dog_001\.jpg: file vanished after the scan|cat_003\.jpg: dangling "
                                           r"symlink).*--strict"):
        convert(source, dst, ConvertOptions(progress=False, workers=2, strict=True, shard_bytes=64 << 10))
    assert not dst.exists() and not staging_path(dst).exists()


def without_root_file_access() -> None:
    """In the child, before exec: root without CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH is held to
    the file modes like any user (PR_CAPBSET_DROP: root's capabilities after exec are the bounding set)."""
    libc = ctypes.CDLL(None, use_errno=True)
    for capability in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
        if libc.prctl(24, capability, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def unprivileged(locked: Path) -> dict:
    """Popen arguments that run a command without root's file-access capabilities (tests run as
    root, which reads a mode-000 file or lists a mode-000 folder); the test is skipped where they
    cannot be dropped."""
    if os.geteuid() != 0:
        return {}
    popen = {"preexec_fn": without_root_file_access}
    try:
        probe = subprocess.run([sys.executable, "-c", f"import os; os.listdir({str(locked)!r}) if os.path.isdir("
                                f"{str(locked)!r}) else open({str(locked)!r}, 'rb')"], capture_output=True,
                               text=True, timeout=30, **popen).stderr
    except (subprocess.SubprocessError, OSError) as exc:  # prctl refused in preexec_fn
        probe = str(exc)
    if "Permission denied" not in probe:
        pytest.skip(f"running as root, whose file-access capabilities cannot be dropped here: root reads a "
                    f"mode-000 file, so nothing can be unreadable ({probe.strip()[-200:]})")
    return popen


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_a_file_without_read_permission_is_skipped(request, source, tmp_path, suffix):
    locked = source / "train/fish/fish_002.jpg"
    locked.chmod(0)
    dst = tmp_path / f"out{suffix}"
    done = run_datapipe(["convert", str(source), str(dst), "--workers", "2", *OPTIONS], **unprivileged(locked))
    assert done.returncode == 0, done.stderr
    assert skipped(dst)["train/fish/fish_002.jpg"] == "permission denied"
    packed = by_key(request.getfixturevalue(PACKED[suffix]))
    assert by_key(dst) == {k: r for k, r in packed.items() if r.path != "train/fish/fish_002.jpg"}


@pytest.mark.parametrize("suffix", [".lmdb", ".wds"])
def test_a_folder_that_cannot_be_listed_is_reported_not_silently_dropped(request, source, tmp_path, suffix):
    """os.walk skips a folder it cannot list without a word: its images vanished from the dataset."""
    locked = source / "train/cat/nested"
    locked.chmod(0)
    popen = unprivileged(locked)
    dst = tmp_path / f"out{suffix}"
    done = run_datapipe(["convert", str(source), str(dst), "--workers", "2", *OPTIONS], **popen)
    assert done.returncode == 0, done.stderr
    assert skipped(dst)["train/cat/nested/"].startswith("folder cannot be listed")
    packed = by_key(request.getfixturevalue(PACKED[suffix]))
    assert by_key(dst) == {k: r for k, r in packed.items() if not r.path.startswith("train/cat/nested/")}
    strict = run_datapipe(["convert", str(source), str(tmp_path / f"strict{suffix}"), "--strict", *OPTIONS], **popen)
    assert strict.returncode != 0 and "train/cat/nested/: folder cannot be listed" in strict.stderr


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_an_io_error_reading_an_input_stops_the_run(source, tmp_path, suffix):
    """/proc/self/mem read from its start fails with EIO: a real input error, not a bad file."""
    failing = source / "train/dog/dog_003.jpg"
    failing.unlink()
    failing.symlink_to("/proc/self/mem")
    dst = tmp_path / f"out{suffix}"
    done = run_datapipe(["convert", str(source), str(dst), "--workers", "2", "--checkpoint-every", "4", *OPTIONS])
    message = one_line_error(done, 1)
    assert "Input/output error" in message and str(failing) in message and "--resume" in message
    assert staging_path(dst).exists() and not dst.exists()


@pytest.mark.parametrize("suffix, says", [(".h5", "too large"), (".lmdb", "LMDB could not write")])
def test_a_full_disk_stops_the_conversion_in_one_line(tmp_path, suffix, says):
    """The output side: a write that fails (RLIMIT_FSIZE past 100 KB, EFBIG as a full disk's ENOSPC)
    stops the run in one line and keeps the finished part; it is never a skipped input (LMDB's
    failure was an lmdb.Error traceback)."""
    dst = tmp_path / f"out{suffix}"

    def small_disk():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))

    done = run_datapipe(["convert", str(IMAGEFOLDER), str(dst), "--workers", "2", "--checkpoint-every", "3"],
                        preexec_fn=small_disk)
    message = one_line_error(done, 1)
    assert says in message and "--resume" in message and not dst.exists()
    assert staging_path(dst).exists()


@pytest.mark.parametrize("suffix", [".lmdb", ".wds"])
def test_a_fifo_or_a_device_named_like_an_image_is_skipped_not_read(request, source, tmp_path, suffix):
    """open() of a FIFO blocks until a writer comes (forever); /dev/zero reads forever."""
    os.mkfifo(source / "train/cat/pipe.jpg")
    (source / "train/dog/zeros.jpg").symlink_to("/dev/zero")
    dst = tmp_path / f"out{suffix}"
    done = run_datapipe(["convert", str(source), str(dst), "--workers", "2", *OPTIONS])
    assert done.returncode == 0, done.stderr
    assert skipped(dst)["train/cat/pipe.jpg"] == "not a regular file (a FIFO)"
    assert skipped(dst)["train/dog/zeros.jpg"] == "not a regular file (a character device)"
    assert by_key(dst) == by_key(request.getfixturevalue(PACKED[suffix]))
