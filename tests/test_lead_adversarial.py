"""What tools/adversarial/cases/lead.py found broken, held here: the command line's usage errors (argparse's)
quoted a URL's password, terminal escapes and 10,000-character arguments as given, and the commands' own
errors allowed 2,000-character lines; a backend or a dataset kind registered wrong (a loader that is not a
Loader, a module or class that is not there, an auto rule or a claims test that raises, a rank that is a
str, an opener that gives None) failed with a bare TypeError, AttributeError or the plugin's own exception."""
from __future__ import annotations

import pytest

from datapipe import make_loader, open_dataset
from datapipe.backends import BackendSpec, register_backend, unregister_backend
from datapipe.backends.threads import ThreadLoader
from datapipe.cli.main import SHOWN_LINE, main
from datapipe.formats import DatasetKind, register_kind, unregister_kind

SMALL = dict(batch_size=4, image_size=16, num_workers=0)
PASSWORD = "lead/Adv3rsarial+pw"  # not in the environment: only the URL rules can mask it


@pytest.mark.parametrize("argv", [
    ["info", "d.wds", "--bogus", f"s3://AKIAEXAMPLE:{PASSWORD}@bucket/x.wds"],
    ["convert", "src", "o.lmdb", "--format", f"https://u:{PASSWORD}@host/x"],
])
def test_a_usage_error_never_quotes_a_urls_password(argv, capsys):
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "error:" in err and PASSWORD not in err and "Adv3rsarial" not in err


def test_a_usage_error_shows_escapes_as_text_and_cuts_a_long_argument(capsys):
    with pytest.raises(SystemExit):
        main(["info", "d.wds", "--bogus", "\x1b]0;pwned\x07\x1b[2J", "n" * 10_000])
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\x07" not in err and "\\x1b]0;pwned" in err
    assert max(len(line) for line in err.splitlines()) <= SHOWN_LINE


def test_a_commands_error_line_is_cut_to_shown_line(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["info", "n" * 10_000]) != 0
    err = capsys.readouterr().err
    assert "error:" in err and max(len(line) for line in err.splitlines()) <= SHOWN_LINE == 1000


@pytest.mark.parametrize("spec, match", [
    (dict(loader=5), "loader must be a Loader subclass or 'module:Class'"),
    (dict(loader="no colon here"), "loader must be a Loader subclass or 'module:Class'"),
    (dict(loader=ThreadLoader, auto="always"), "auto must be a function"),
    (dict(loader=ThreadLoader, auto=lambda s: "x", auto_rank="0"), "auto_rank must be an int, got '0'"),
])
def test_a_backend_spec_written_wrong_is_refused_when_made(spec, match):
    with pytest.raises(ValueError, match=match):
        BackendSpec("mine", **spec)


@pytest.mark.parametrize("loader, match", [
    (int, r"backend 'mine': its loader <class 'int'> is not a subclass of datapipe.backends.base.Loader"),
    ("no_such_module_lead:Loader", r"backend 'mine': its loader's module 'no_such_module_lead' is not installed"),
    (".threads:NoSuchLoader", r"backend 'mine': module 'datapipe.backends.threads' has no 'NoSuchLoader'"),
])
def test_a_backends_loader_that_is_not_there_or_not_a_loader_is_named_at_use(loader, match, packed_lmdb):
    register_backend(BackendSpec("mine", loader))
    try:
        with pytest.raises(ValueError, match=match):
            make_loader(packed_lmdb, backend="mine", **SMALL)
    finally:
        unregister_backend("mine")


@pytest.mark.parametrize("rule, match", [
    (lambda s: 1 / 0, r"backend 'mine': its auto rule raised ZeroDivisionError\('division by zero'\)"),
    (lambda s: True, r"backend 'mine': its auto rule gave True .* must give the reason \(a str\) or None"),
])
def test_an_auto_rule_that_raises_or_gives_no_reason_is_named(rule, match, packed_lmdb):
    register_backend(BackendSpec("mine", ThreadLoader, auto=rule, auto_rank=0))
    try:
        with pytest.raises(ValueError, match=match):
            make_loader(packed_lmdb, **SMALL)
    finally:
        unregister_backend("mine")


@pytest.mark.parametrize("fields, match", [
    (dict(claims="yes", open=open_dataset), "dataset kind 'mine': claims must be a function, got 'yes'"),
    (dict(claims=bool, open=None), "dataset kind 'mine': open must be a function, got None"),
    (dict(claims=bool, open=open_dataset, rank="1"), "dataset kind 'mine': rank must be an int, got '1'"),
])
def test_a_dataset_kind_written_wrong_is_refused_when_made(fields, match):
    with pytest.raises(ValueError, match=match):
        DatasetKind("mine", **fields)


def _raises(exc: Exception):
    def claims(path):
        raise exc
    return claims


def test_a_claims_test_that_raises_is_named_and_the_librarys_own_errors_pass(packed_lmdb):
    register_kind(DatasetKind("mine", _raises(RuntimeError("plugin bug")), open_dataset, rank=1))
    try:
        with pytest.raises(ValueError, match=r"dataset kind 'mine': its claims test raised RuntimeError\('plugin bug'\)"):
            open_dataset(packed_lmdb)
    finally:
        unregister_kind("mine")
    for own in (ValueError("a manifest that is a FIFO"), PermissionError(13, "Permission denied")):
        register_kind(DatasetKind("mine", _raises(own), open_dataset, rank=1))
        try:
            with pytest.raises(type(own)) as raised:
                open_dataset(packed_lmdb)
            assert raised.value is own
        finally:
            unregister_kind("mine")


def test_an_opener_that_gives_no_dataset_is_named(tmp_path):
    register_kind(DatasetKind("mine", lambda p: str(p).endswith(".mine"), lambda *a, **k: None, rank=1))
    try:
        with pytest.raises(ValueError, match="dataset kind 'mine': its open gave None, not a datapipe.formats.base"):
            make_loader(str(tmp_path / "x.mine"), **SMALL)
    finally:
        unregister_kind("mine")
