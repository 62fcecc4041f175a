"""LMDB and HDF5 files are parsed by C libraries that do not defend against crafted files (issue #25,
part 5): given the sha256 you trust, datapipe checks the file they parse before either library sees it."""
from __future__ import annotations

import hashlib

import h5py
import lmdb
import pytest

from datapipe import make_loader, open_dataset
from datapipe.cli.main import main

WRONG = "0" * 64


@pytest.fixture(params=["lmdb", "hdf5"])
def trusted(request) -> tuple[str, str]:
    """A packed LMDB or HDF5 dataset and the sha256 of the file its C library parses."""
    path = request.getfixturevalue(f"packed_{request.param}")
    file = path / "data.mdb" if path.is_dir() else path
    return str(path), hashlib.sha256(file.read_bytes()).hexdigest()


@pytest.fixture
def no_c_parser(monkeypatch):
    """Any h5py or LMDB open is a failure."""
    def refuse(*args, **kwargs):
        raise AssertionError(f"a C library was asked to open {args[:1]}")

    monkeypatch.setattr(h5py, "File", refuse)
    monkeypatch.setattr(lmdb, "open", refuse)


def refused(digest: str) -> str:
    return rf": its sha256 is {digest}, not the {WRONG} you trust: it is another file .*; not opened$"


def test_open_dataset_refuses_another_file_before_its_c_library_opens_it(trusted, no_c_parser):
    path, digest = trusted
    with pytest.raises(ValueError, match=refused(digest)):
        open_dataset(path, sha256=WRONG)


def test_the_trusted_digest_opens_it(trusted):
    path, digest = trusted
    ds = open_dataset(path, sha256=digest.upper())
    assert len(ds) > 0 and ds.record(0).data


def test_make_loader_checks_it_too(trusted, no_c_parser):
    path, digest = trusted
    with pytest.raises(ValueError, match=refused(digest)):
        make_loader(path, sha256=WRONG, backend="dataloader", batch_size=4, image_size=32)


def test_datapipe_verify_checks_the_digest_before_anything_parses_the_file(trusted, no_c_parser, capsys):
    path, digest = trusted
    assert main(["verify", path, "--sha256", WRONG]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("datapipe verify: error: ") and f"sha256 is {digest}" in err


def test_datapipe_verify_with_the_trusted_digest_goes_on_to_the_records(trusted, capsys):
    path, digest = trusted
    assert main(["verify", path, "--sha256", digest]) == 0
    assert "OK" in capsys.readouterr().out


@pytest.mark.parametrize("digest, message", [("abc", "is not 64 hex digits"),
                                             (WRONG, "is neither an HDF5 file nor an LMDB folder")])
def test_a_digest_that_cannot_be_checked_is_an_error(packed_wds, digest, message):
    with pytest.raises(ValueError, match=message):
        open_dataset(packed_wds, sha256=digest)
