"""Shared fixtures: the fixture image folder, and it converted once per format per session."""
from __future__ import annotations

import faulthandler
import importlib.util
import shutil
import signal
import tempfile
from pathlib import Path

import pytest

from converters import ConvertOptions, convert
from datapipe.formats.scan import scan_folder
from tests.forked import run_forked

# The files whose tests take longest go first: `make test` deals test files to two workers in
# collection order, and a long file started last would leave one worker idle at the end. Then the
# other files over ~15 s in a full run here (the last four were dealt last before, alphabetically).
SLOW_FIRST = ("tests/trainers/", "tests/train/", "tests/storage/", "tests/converters/test_ray.py", "tests/test_docs.py",
              "tests/backends/test_ray_pool.py", "tests/backends/test_loaders.py", "tests/test_bench.py",
              "tests/backends/test_worker_processes.py", "tests/formats/test_hdf5_index.py",
              "tests/backends/test_dali_recipes.py", "tests/test_shard_order.py", "tests/test_selftest.py",
              "tests/test_ray_tools.py")


def pytest_collection_modifyitems(config, items) -> None:
    def rank(item) -> int:
        where = item.nodeid
        return next((i for i, prefix in enumerate(SLOW_FIRST) if where.startswith(prefix)), len(SLOW_FIRST))

    items.sort(key=rank)  # stable: the order within a file, and of the other files, is kept


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    """A test marked `forked` runs in a forked child (tests/forked.py)."""
    if pyfuncitem.get_closest_marker("forked") is None:
        return None
    run_forked(pyfuncitem)
    return True


def installed(module: str) -> bool:
    """Whether `module` is installed: found, not imported. The tests that run Lightning,
    Accelerate, Ignite or Ray Train in child processes only skip on this: pytest.importorskip would
    import the library into every pytest worker at collection (Lightning alone: ~4 s of CPU each)."""
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package of a dotted name is missing
        return False


FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
IMAGEFOLDER = FIXTURES / "imagefolder"
SUFFIX = {"lmdb": ".lmdb", "hdf5": ".h5", "wds": ".wds"}
BAD_FILES = {
    "train/cat/truncated.jpg": "truncated",
    "train/dog/empty.jpg": "empty file",
    "train/dog/text.jpg": "not an image",
    "train/fish/bomb.png": "decompression bomb",
}


@pytest.fixture(scope="session")
def imagefolder() -> Path:
    return IMAGEFOLDER


@pytest.fixture(scope="session", params=sorted(SUFFIX))
def packed(request) -> Path:
    """The fixture folder converted to each format (session-wide; tests must not modify it)."""
    return request.getfixturevalue(f"packed_{request.param}")


@pytest.fixture
def packed_copy(packed, tmp_path) -> Path:
    """A private copy of a packed dataset that a test may damage."""
    dst = tmp_path / packed.name
    (shutil.copytree if packed.is_dir() else shutil.copy2)(packed, dst)
    return dst


@pytest.fixture(scope="session")
def clean_folder(tmp_path_factory):
    """The fixture folder without its bad files (DALI's readers.file decodes whatever it is given)."""
    root = tmp_path_factory.mktemp("clean") / "images"
    shutil.copytree(IMAGEFOLDER, root, symlinks=False)
    for bad in BAD_FILES:
        (root / bad).unlink()
    return root


@pytest.fixture(scope="session")
def foreign_shards(tmp_path_factory):
    """Shards written by the webdataset library itself: .jpg/.png + .cls, no .idx, no manifest."""
    import webdataset as wds

    root = tmp_path_factory.mktemp("foreign")
    files = [f for f in scan_folder(IMAGEFOLDER).splits["train"] if f.relpath not in BAD_FILES
             and f.path.read_bytes()[:3] in (b"\xff\xd8\xff", b"\x89PN")]
    for shard in range(2):
        with wds.TarWriter(str(root / f"foreign-{shard:06d}.tar")) as sink:
            for f in files[shard::2]:
                ext = "jpg" if f.path.read_bytes()[:3] == b"\xff\xd8\xff" else "png"
                sink.write({"__key__": f.key, ext: f.path.read_bytes(), "cls": str(f.label)})
    return str(root / "foreign-{000000..000001}.tar")


def _packed(tmp_path_factory, suffix):
    dst = tmp_path_factory.mktemp(suffix.strip(".")) / f"fixture{suffix}"
    convert(IMAGEFOLDER, dst, ConvertOptions(workers=2, progress=False, shard_bytes=64 << 10))
    return dst


@pytest.fixture(scope="session")
def packed_lmdb(tmp_path_factory):
    return _packed(tmp_path_factory, ".lmdb")


@pytest.fixture(scope="session")
def packed_hdf5(tmp_path_factory):
    return _packed(tmp_path_factory, ".h5")


@pytest.fixture(scope="session")
def packed_wds(tmp_path_factory):
    return _packed(tmp_path_factory, ".wds")


@pytest.fixture(scope="session")
def ray_home():
    """A short scratch folder (Ray's socket paths must stay under ~107 bytes) used as HOME by every local
    Ray of the test process (here, so that the modules share it: tests/converters/test_ray.py,
    tests/trainers/test_ray_train.py). Ray writes its auth token to ~/.ray/auth_token at the first
    ray.init and caches, in the driver, that it has one: a later ray.init under another HOME writes
    none there, and its GCS server, finding none, never starts (the suite's one flaky failure)."""
    home = Path(tempfile.mkdtemp(prefix="ray", dir="/tmp"))
    yield home
    shutil.rmtree(home, ignore_errors=True)


HANG_LIMIT_S = 240  # a multi-process test that hangs fails after this long


@pytest.fixture
def within():
    """Fail a test that runs past HANG_LIMIT_S: a TimeoutError where Python runs, and where a call into
    DALI or a worker never returns, all threads' tracebacks and the process's exit (faulthandler) a bit later."""
    def expired(signum, frame):
        raise TimeoutError(f"the test ran past {HANG_LIMIT_S} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(HANG_LIMIT_S)
    faulthandler.dump_traceback_later(HANG_LIMIT_S + 30, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)
