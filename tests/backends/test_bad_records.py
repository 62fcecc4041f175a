"""on_error in every backend: bad records are substituted (batches keep their size, ranks their
batch counts), named, counted and bounded; `raise` names the file; nothing escapes the policy."""
import multiprocessing
import shutil

import lmdb
import pytest

from datapipe import make_loader
from datapipe.backends.bad_samples import TooManyBadSamples
from datapipe.formats.lmdb import record_key
from tests.conftest import BAD_FILES, IMAGEFOLDER

BACKENDS = ["dataloader", "threads", "prefetch", "dali"]
SMALL = dict(batch_size=4, image_size=32, num_workers=1)


def served(loader):
    batches = [idx.tolist() for _, _, idx in loader]
    assert len(batches) == len(loader) and all(len(b) == 4 for b in batches[:-1]) and batches[-1]
    return [i for b in batches for i in b]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("train", [True, False])
def test_bad_files_in_a_folder_are_replaced_named_and_counted(backend, train, caplog):
    loader = make_loader(IMAGEFOLDER, backend=backend, train=train, max_bad_fraction=0.5, **SMALL)
    seen = served(loader)
    assert len(seen) == 31  # every slot of the epoch filled: 27 good records + 4 substitutes
    bad = {b.path: b for b in loader.skipped}
    assert set(bad) == set(BAD_FILES)
    assert all(b.reason and b.substitute in seen for b in bad.values())
    assert any("truncated.jpg" in r.message for r in caplog.records)


@pytest.mark.parametrize("backend", BACKENDS)
def test_on_error_raise_names_the_file(backend):
    loader = make_loader(IMAGEFOLDER, backend=backend, on_error="raise", train=False, **{**SMALL, "batch_size": 31})
    with pytest.raises(RuntimeError, match=r"cannot read or decode record \d+ \(train/(cat|dog|fish)/"):
        next(iter(loader))


@pytest.mark.parametrize("backend", ["dataloader", "prefetch"])  # DALI's source workers live with its pipeline
@pytest.mark.parametrize("persistent", [True, False])
def test_an_error_that_ends_the_epoch_stops_its_worker_processes_before_it_arrives(backend, persistent):
    """The error's traceback holds torch's iterator, which kept its workers until a garbage collection
    later stopped them after 5 s each (its stop message lost by then): now they are gone when the error
    arrives, and the next epoch starts new ones."""
    before = set(multiprocessing.active_children())
    loader = make_loader(IMAGEFOLDER, backend=backend, on_error="raise", train=False, persistent_workers=persistent,
                         **{**SMALL, "batch_size": 31, "num_workers": 2})
    for epoch in range(2):
        with pytest.raises(RuntimeError, match=r"cannot read or decode record \d+ \(train/"):
            next(iter(loader))
        assert set(multiprocessing.active_children()) - before == set(), f"epoch {epoch}: workers left running"


@pytest.mark.parametrize("backend", BACKENDS)
def test_more_bad_records_than_the_bound_stop_the_run(backend):
    loader = make_loader(IMAGEFOLDER, backend=backend, **SMALL)  # default bound: 1% of the epoch
    with pytest.raises(TooManyBadSamples, match="could not be read or decoded, more than max_bad_fraction=0.01"):
        list(loader)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_dataset_that_is_all_bad_is_an_error_not_an_empty_epoch(backend, tmp_path):
    for i in range(6):
        (tmp_path / "a").mkdir(exist_ok=True)
        (tmp_path / "a" / f"{i}.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    loader = make_loader(tmp_path, backend=backend, max_bad_fraction=1.0, **SMALL)
    with pytest.raises(RuntimeError, match="looks broken"):
        list(loader)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_record_that_cannot_be_read_is_under_the_policy(backend, packed_lmdb, tmp_path):
    damaged = tmp_path / "damaged.lmdb"
    shutil.copytree(packed_lmdb, damaged)
    env = lmdb.open(str(damaged), subdir=True)
    with env.begin(write=True) as txn:
        txn.put(record_key("train", 3), b"\x07\x00")  # a value that is not a record
    env.close()
    loader = make_loader(damaged, backend=backend, max_bad_fraction=0.5, **SMALL)
    seen = served(loader)
    assert [b.index for b in loader.skipped] == [3] and 3 not in seen and loader.skipped[0].path == "record 3"


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_file_removed_after_the_scan_is_skipped_and_named(backend, clean_folder, tmp_path):
    root = tmp_path / "images"
    shutil.copytree(clean_folder, root)
    loader = make_loader(root, backend=backend, max_bad_fraction=0.5, **SMALL)
    (root / "train" / "cat" / "cat_001.jpg").unlink()
    served(loader)
    assert [b.path for b in loader.skipped] == ["train/cat/cat_001.jpg"]
    assert "FileNotFoundError" in loader.skipped[0].reason


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_file_name_that_is_not_utf8_loads(backend, clean_folder, tmp_path):
    import os

    root = tmp_path / "images"
    shutil.copytree(clean_folder, root)
    os.rename(root / "train" / "cat" / "cat_001.jpg", os.fsencode(root / "train" / "cat") + b"/caf\xe9.jpg")
    loader = make_loader(root, backend=backend, **SMALL)
    assert sorted(served(loader)) == list(range(len(loader.dataset))) and not loader.skipped
