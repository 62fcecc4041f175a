"""`datapipe preview`: the grid's shape, the same view per record in every backend, skipped and failing backends."""
import dataclasses
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

import datapipe.preview as preview_module
from datapipe.augment.recipe import resolve_recipe
from datapipe.backends.registry import backend_spec, dali_installed, register_backend
from datapipe.errors import ExpectedError
from datapipe.preview import (CAPTION_LINES, LABEL_W, LINE_H, PAD, PreviewOptions, captions, grid_layout, preview,
                              tile_origin)
from tests.conftest import IMAGEFOLDER

SIZE = 32
# deit: auto-augment, pixel erasing, mixup/cutmix and smoothing: every stage a backend could get wrong
OPTIONS = PreviewOptions(recipe="deit", records=4, epochs=2, backends=("threads", "dataloader"), image_size=SIZE)


@pytest.fixture(scope="module")
def shown():
    return preview(IMAGEFOLDER, OPTIONS)


def test_grid_has_the_expected_size_and_the_tiles_in_place(shown, tmp_path):
    path = shown.save(tmp_path / "sub" / "grid.png")
    picture = np.asarray(Image.open(path).convert("RGB"))
    top = grid_layout(shown)[2]
    rows = OPTIONS.epochs * len(OPTIONS.backends)
    assert picture.shape == (top + rows * (SIZE + CAPTION_LINES * LINE_H + PAD) + PAD,
                             LABEL_W + OPTIONS.records * (SIZE + PAD) + PAD, 3)
    assert [(row.epoch, row.backend) for row in shown.rows] == [
        (0, "threads"), (0, "dataloader"), (1, "threads"), (1, "dataloader")]  # epoch-major: backends adjacent
    for r, row in enumerate(shown.rows):
        assert row.images.shape == (OPTIONS.records, 3, SIZE, SIZE) and row.images.dtype == torch.uint8
        for c, image in enumerate(row.images):
            left, top = tile_origin(shown, r, c)
            np.testing.assert_array_equal(picture[top:top + SIZE, left:left + SIZE], image.permute(1, 2, 0).numpy())


def test_threads_and_dataloader_tiles_are_pixel_identical(shown):
    for epoch in range(OPTIONS.epochs):
        threads, dataloader = shown.row("threads", epoch), shown.row("dataloader", epoch)
        assert threads.indices == dataloader.indices and threads.captions == dataloader.captions
        assert torch.equal(threads.images, dataloader.images), f"epoch {epoch}: the backends' views differ"


def test_epochs_show_new_views(shown):
    zero, one = shown.row("threads", 0), shown.row("threads", 1)
    assert zero.indices != one.indices  # a new order: the first batch holds other records
    assert not torch.equal(zero.images, one.images)
    assert (zero.images.float() - one.images.float()).abs().mean() > 10


def test_soft_targets_are_captioned_with_their_top_two_classes(shown):
    assert all(len(c) == 3 and c[0].startswith("#") for row in shown.rows for c in row.captions)
    soft = torch.tensor([[0.1, 0.6, 0.3]])
    assert captions(soft, [7], ["cat", "dog", "fish"]) == [["#7", "dog 0.60", "fish 0.30"]]
    assert captions(torch.tensor([2]), [5], ["cat", "dog", "fish"]) == [["#5", "fish"]]
    assert "deit (" in shown.header() and "mixup_alpha=0.8" in shown.header()


@pytest.mark.parametrize("backends, match", [(("threads", "nope"), "unknown or repeated \\['nope'\\]"),
                                             ((), "unknown or repeated"), (("threads", "threads"), "repeated")])
def test_an_unknown_backend_is_a_one_line_error(backends, match):
    with pytest.raises(ValueError, match=match) as caught:
        PreviewOptions(backends=backends)
    assert "\n" not in str(caught.value) and "threads,dataloader,prefetch,dali" in str(caught.value)


@pytest.mark.parametrize("backends", ["threads", None, ("threads", 5)])
def test_backends_that_are_not_a_tuple_of_names_are_a_one_line_error(backends):
    with pytest.raises(ValueError, match="backends must be a tuple of backend names"):
        PreviewOptions(backends=backends)


@pytest.fixture
def dali_absent():
    """DALI's registration as a machine without it sees it: its required module is not there."""
    real = backend_spec("dali")
    register_backend(dataclasses.replace(real, requires="nvidia.no_such_dali"), replace=True)
    yield
    register_backend(real, replace=True)


def test_a_missing_dali_is_skipped_with_a_note(dali_absent):
    assert not dali_installed()
    shown = preview(IMAGEFOLDER, PreviewOptions(records=2, epochs=1, backends=("threads", "dali"), image_size=16))
    assert [row.backend for row in shown.rows] == ["threads"]
    assert "dali: skipped, not installed (pip install 'datapipe[dali]')" in shown.notes


def test_a_failing_backend_is_named_in_one_line_and_the_rest_render(monkeypatch):
    real = preview_module.make_loader

    def make_loader(source, *, backend, **kw):
        if backend == "dataloader":
            raise RuntimeError("worker exploded\nwith a long traceback")
        return real(source, backend=backend, **kw)

    monkeypatch.setattr(preview_module, "make_loader", make_loader)
    options = PreviewOptions(records=2, epochs=1, backends=("dataloader", "threads"), image_size=16)
    shown = preview(IMAGEFOLDER, options)
    assert [row.backend for row in shown.rows] == ["threads"]
    assert "dataloader: failed, not shown: worker exploded" in shown.notes
    with pytest.raises(ExpectedError, match="no backend produced a batch: dataloader: failed"):
        preview(IMAGEFOLDER, PreviewOptions(records=2, epochs=1, backends=("dataloader",), image_size=16))


def run(*args):
    command = [sys.executable, "-m", "datapipe", "preview", *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True)


def test_cli_preview_writes_the_png(tmp_path):
    out = tmp_path / "grid.png"
    done = run(IMAGEFOLDER, "--recipe", "tv-v2", "--out", out, "--records", "3", "--epochs", "2",
               "--backends", "threads,dataloader", "--image-size", "24")
    assert done.returncode == 0, done.stderr
    assert f"wrote {out}: 2 epochs x threads, dataloader, 3 records each, recipe tv-v2" in done.stdout
    assert Image.open(out).size[0] == LABEL_W + 3 * (24 + PAD) + PAD


@pytest.mark.parametrize("args, match", [(["--backends", "threads,fast"], "unknown or repeated ['fast']"),
                                         (["--recipe", "nope"], "recipe must be a datapipe.Recipe or one of")])
def test_cli_preview_bad_options_are_one_line(tmp_path, args, match):
    done = run(IMAGEFOLDER, "--out", tmp_path / "x.png", *args)
    assert done.returncode == 2 and done.stderr.startswith("datapipe preview: error: ") and match in done.stderr
    assert done.stderr.count("\n") == 1 and not (tmp_path / "x.png").exists()


def recipe_flag_values(parser) -> list[list[str]]:
    """Each flag of `datapipe train`'s recipe group, read from its parser, with a value it takes."""
    from datapipe.cli.recipe import RECIPE_GROUP

    train = next(a for a in parser._subparsers._group_actions[0].choices.items() if a[0] == "train")[1]
    group = next(g for g in train._action_groups if g.title == RECIPE_GROUP)
    found = []
    for action in group._group_actions:
        flag = action.option_strings[-1]
        if action.dest == "recipe":
            value = ["deit"]
        elif action.choices:
            value = [action.choices[-1]]
        elif action.nargs == 2:
            value = ["0.3", "0.9"]
        else:
            value = [{float: "0.25", int: "2"}.get(action.type, "augmix-m3-w3")]
        found.append([flag, *value])
    return found


def test_preview_takes_every_recipe_flag_train_takes():
    """Was: preview took --recipe presets only (`--aa augmix-m3-w3`: an unknown argument)."""
    from datapipe.cli.main import build_parser
    from datapipe.cli.recipe import train_recipe

    parser = build_parser()
    flags = recipe_flag_values(parser)
    assert len(flags) > 20 and {"--aa", "--color-jitter", "--mixup", "--scale"} <= {f[0] for f in flags}
    for flag in flags:
        trained = train_recipe(parser.parse_args(["train", "data", "--out", "o", *flag]), {})
        previewed = train_recipe(parser.parse_args(["preview", "data", "--out", "x.png", *flag]), {})
        assert trained is not None and previewed == trained, flag


def test_cli_preview_renders_a_recipe_changed_by_flags(tmp_path):
    out = tmp_path / "augmix.png"
    done = run(IMAGEFOLDER, "--aa", "augmix-m3-w3", "--hflip", "0", "--out", out, "--records", "1", "--epochs", "1",
               "--backends", "threads", "--image-size", "24")
    assert done.returncode == 0, done.stderr
    assert f"wrote {out}: 1 epoch x threads, 1 record each, recipe default+ (hflip=0.0, auto_augment=augmix-m3-w3)" \
        in done.stdout
    assert Image.open(out).size[0] == LABEL_W + 24 + 2 * PAD
    plain_view = preview(IMAGEFOLDER, PreviewOptions(records=2, epochs=1, backends=("threads",), image_size=24))
    augmix = preview(IMAGEFOLDER, PreviewOptions(recipe=resolve_recipe(None, auto_augment="augmix-m3-w3"), records=2,
                                                 epochs=1, backends=("threads",), image_size=24))
    assert not torch.equal(plain_view.rows[0].images, augmix.rows[0].images)  # the flag reached the view
