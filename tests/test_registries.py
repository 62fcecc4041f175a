"""One registry per extension point (#49): a made-up backend and a made-up dataset kind, each one
registration, run through make_loader and offered by the CLI; the built-in entries read from the tables."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
import subprocess
from pathlib import Path

import pytest
import torch

from datapipe import Mix, make_loader, open_dataset
from datapipe import backends
from datapipe.backends import BackendSpec, backend_names, choose_backend, register_backend, unregister_backend
from datapipe.backends.threads import ThreadLoader
from datapipe.cli.main import build_parser
from datapipe.formats import DatasetKind, dataset_kinds, register_kind, unregister_kind
from datapipe.formats.base import Dataset
from datapipe.records import Record

ROOT = Path(__file__).resolve().parents[1]
SMALL = dict(batch_size=4, image_size=16, num_workers=0)


class InlineLoader(ThreadLoader):
    """The made-up backend: the thread backend under another name (what a new backend's module holds)."""

    backend = "inline"


@pytest.fixture
def inline():
    register_backend(BackendSpec("inline", InlineLoader, summary="threads, renamed"))
    yield
    unregister_backend("inline")


def test_a_made_up_backend_is_one_registration_through_make_loader_and_the_cli(inline, packed_lmdb):
    loader = make_loader(packed_lmdb, backend="inline", **SMALL)
    assert type(loader) is InlineLoader and loader.backend == "inline"
    seen = [i for _, _, idx in loader for i in idx.tolist()]
    assert sorted(seen) == list(range(len(open_dataset(packed_lmdb))))
    assert "inline" in backends.BACKENDS and "inline" in backend_names()
    parser = build_parser()
    assert parser.parse_args(["train", str(packed_lmdb), "--out", "o", "--backend", "inline"]).backend == "inline"
    train = next(a for a in parser._subparsers._group_actions[0].choices["train"]._actions if "--backend" in a.option_strings)
    assert "inline" in train.choices
    bench = parser._subparsers._group_actions[0].choices["bench"]
    assert "inline" in bench.format_help()


def test_auto_asks_the_registered_rules_in_rank_order(packed_lmdb):
    register_backend(BackendSpec("eager", InlineLoader, auto=lambda s: "made up: first in rank" if s.device == "cpu"
                                 else None, auto_rank=1))
    try:
        assert choose_backend("auto", torch.device("cpu")) == ("eager", "made up: first in rank")
        assert type(make_loader(packed_lmdb, **SMALL)) is InlineLoader
    finally:
        unregister_backend("eager")
    assert choose_backend("auto", torch.device("cpu"))[0] == "threads"


def test_the_built_in_backends_and_names_are_refused_in_one_line():
    assert backends.BACKENDS == ("auto", "threads", "dataloader", "prefetch", "dali", "ray")
    with pytest.raises(ValueError, match="a backend named 'threads' is registered already"):
        register_backend(BackendSpec("threads", InlineLoader))
    with pytest.raises(ValueError, match="other than 'auto'"):
        BackendSpec("auto", InlineLoader)
    with pytest.raises(ValueError, match=r"unknown backend 'nope'; choose one of \('auto', 'threads'"):
        choose_backend("nope", torch.device("cpu"))


def test_what_a_backend_honours_is_read_from_its_registration(packed_lmdb):
    """A user's transform=, the preview's rows and an absent requirement come from the spec, not its name."""
    from datapipe.augment.custom import Transform
    from datapipe.preview import PreviewOptions, preview

    class Flip(Transform):
        def draw(self, rng):
            return None

        def apply(self, image, params):
            return image.flip(-1)

    register_backend(BackendSpec("graph", InlineLoader, auto=lambda s: None, transforms="none"))
    register_backend(BackendSpec("absent", InlineLoader, auto=lambda s: None, requires="no_such_module.x",
                                 extra="absent", preview=False))
    try:
        with pytest.raises(ValueError, match=r"backend='graph' cannot apply a Python transform inside its graph: use "
                                             r"backend='threads' or 'dataloader' or 'prefetch' or 'ray' or 'absent'$"):
            make_loader(packed_lmdb, backend="graph", transform=Flip(), **SMALL)
        with pytest.raises(ValueError, match=r"backend='absent' cannot make an opaque transform \(function\) "
                                             r"deterministic .* use backend='dataloader' or 'prefetch'"):
            make_loader(packed_lmdb, backend="absent", transform=lambda im: im, **{**SMALL, "num_workers": 1})
        assert make_loader(packed_lmdb, backend="absent", transform=Flip(), **SMALL) is not None
        options = PreviewOptions(records=2, epochs=1, backends=("threads", "absent"), image_size=16)
        assert "graph" in PreviewOptions().backends and "absent" not in PreviewOptions().backends
        shown = preview(packed_lmdb, options)
        assert [row.backend for row in shown.rows] == ["threads"]
        assert "absent: skipped, not installed (pip install 'datapipe[absent]')" in shown.notes
        parser = build_parser()
        assert parser.parse_args(["preview", "d", "--out", "o.png"]).backends == ",".join(PreviewOptions().backends)
    finally:
        unregister_backend("graph")
        unregister_backend("absent")
    with pytest.raises(ValueError, match=r"transforms must be one of \('any', 'portable', 'none'\), got 'some'"):
        BackendSpec("odd", InlineLoader, transforms="some")
    with pytest.raises(ValueError, match="requires must be a module's dotted name"):
        BackendSpec("odd", InlineLoader, requires="not a module")


def test_a_plugin_spec_written_wrong_is_refused_in_one_bounded_line(tmp_path, monkeypatch):
    """The adversarial pass over #49's fields: flags that are not bools, an extra that would be a shell
    command in the printed hint, names of a megabyte; a required module whose parent fails to import is
    not installed (no traceback out of the preview)."""
    from datapipe.backends.registry import module_installed

    for field, value in (("inline_without_workers", "no"), ("preview", 1)):
        with pytest.raises(ValueError, match=f"{field} must be True or False"):
            BackendSpec("odd", InlineLoader, **{field: value})
    for extra in ("x]' ; touch ~/pwned ; echo '", "dali ray", 5, "e" * 1_000_000):
        with pytest.raises(ValueError, match="extra must be a pip extra's name") as caught:
            BackendSpec("odd", InlineLoader, extra=extra)
        assert len(str(caught.value)) < 400
    with pytest.raises(ValueError, match="requires must be a module's dotted name"):
        BackendSpec("odd", InlineLoader, requires="m" * 1_000_000)
    (tmp_path / "boom").mkdir()
    (tmp_path / "boom" / "__init__.py").write_text("raise RuntimeError('plugin parent broken')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert not module_installed("boom.sub") and not module_installed("os.nope") and module_installed("json.decoder")


def test_the_transform_refusals_stay_bounded_and_say_so_when_no_backend_takes_one(packed_lmdb):
    with pytest.raises(ValueError, match=r"transform must be .* got 'xxx") as caught:
        make_loader(packed_lmdb, backend="threads", transform="x" * 1_000_000, **SMALL)
    assert len(str(caught.value)) < 400
    replaced = [backends.backend_spec(name) for name in ("dataloader", "prefetch")]
    try:
        for spec in replaced:
            register_backend(dataclasses.replace(spec, transforms="portable"), replace=True)
        with pytest.raises(ValueError, match="no registered backend takes any callable, or write it as a datapipe"):
            make_loader(packed_lmdb, backend="threads", transform=lambda im: im, **{**SMALL, "num_workers": 1})
    finally:
        for spec in replaced:
            register_backend(spec, replace=True)


class ListingDataset(Dataset):
    """The made-up kind: `NAME.listing`, JSON {"classes": [...], "items": [[file, label], ...]}, files
    relative to the listing's folder."""

    format = "listing"

    def __init__(self, path: str | Path, split: str) -> None:
        body = json.loads(Path(path).read_text())
        self.root, self.items = Path(path).parent, body["items"]
        super().__init__(path, split=split, classes=body["classes"], size=len(self.items))

    def _read(self, index: int) -> Record:
        name, label = self.items[index]
        data = (self.root / name).read_bytes()
        return Record(f"item{index:04d}", data, int(label), name, hashlib.sha256(data).hexdigest())


@pytest.fixture
def listing(tmp_path):
    register_kind(DatasetKind("listing", lambda p: str(p).endswith(".listing"),
                              lambda p, split, **_: ListingDataset(p, split)))
    folder = ROOT / "fixtures" / "imagefolder" / "train"
    items = [[str(f.relative_to(folder)), c] for c, cls in enumerate(("cat", "dog"))
             for f in sorted((folder / cls).glob("*.jpg"))[:3]]
    for name, _ in items:
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_bytes((folder / name).read_bytes())
    path = tmp_path / "six.listing"
    path.write_text(json.dumps({"classes": ["cat", "dog"], "items": items}))
    yield path
    unregister_kind("listing")


def test_a_made_up_dataset_kind_is_one_registration_through_open_dataset_and_make_loader(listing, packed_lmdb):
    ds = open_dataset(listing)
    assert isinstance(ds, ListingDataset) and len(ds) == 6 and ds.classes == ["cat", "dog"]
    loader = make_loader(str(listing), backend="threads", **SMALL)
    got = sorted((i, l) for _, labels, idx in loader for i, l in zip(idx.tolist(), labels.tolist()))
    assert got == [(i, ds[i].label) for i in range(6)]
    mixed = make_loader(Mix({"list": str(listing), "lm": str(packed_lmdb)}), backend="threads",
                        fields=("image", "label", "source"), **SMALL)
    assert {int(s) for b in mixed for s in b.sources} == {0, 1}


def test_the_built_in_kinds_in_the_order_open_dataset_asks_them():
    assert [k.name for k in dataset_kinds()] == ["url", "parquet", "staging", "shards", "packed", "folder"]
    with pytest.raises(ValueError, match="a dataset kind named 'folder' is registered already"):
        register_kind(DatasetKind("folder", bool, open_dataset))


def test_the_cli_parser_imports_no_torch():
    """The registries the parser reads are light: `datapipe convert --help` still starts without torch."""
    code = "import sys; from datapipe.cli import main; main.__module__; from datapipe.cli.main import build_parser; " \
           "build_parser(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.stdout.strip() == "False", out.stderr[-2000:]
