"""Bounded memory per image (#34): a 65535 x 1 or 1 x 65535 PNG (a few hundred bytes) once made the
eval view ask for 12.9 GB at 224 px. Past MAX_ASPECT its sides are refused at convert (reported with
the reason) and at load (served around by the on_error policy, named); the train view stays bounded."""
import io
import shutil

import numpy as np
import pytest
from PIL import Image

from converters import ConvertOptions, convert
from datapipe import make_loader
from datapipe.image.decode import check_image
from datapipe.image.geometry import MAX_ASPECT
from datapipe.image.headers import BadImageError
from datapipe.augment.view import plan_and_decode

SHAPES = [(1, 65535), (65535, 1)]  # numpy (rows, columns): 65535 wide x 1 high, then 1 wide x 65535 high


def png(shape) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.full(shape, 200, np.uint8)).save(buf, "PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def extreme_folder(tmp_path_factory, clean_folder):
    root = tmp_path_factory.mktemp("extreme") / "images"
    shutil.copytree(clean_folder, root)
    for split in ("train", "val"):
        for k, shape in enumerate(SHAPES):
            (root / split / "cat" / f"strip_{k}.png").write_bytes(png(shape))
    return root


@pytest.mark.parametrize("shape", SHAPES)
def test_convert_refuses_the_shape_naming_the_limit(shape):
    with pytest.raises(BadImageError, match=rf"sides more than {MAX_ASPECT}:1"):
        check_image(png(shape))
    assert plan_and_decode(png(shape), None, 0, 0, 0, 224, train=True)[0].shape == (3, 224, 224)  # the train view's crop is bounded


@pytest.mark.parametrize("backend", ["threads", "dataloader", "dali"])
def test_an_eval_loader_serves_around_them_and_names_them(extreme_folder, backend):
    if backend == "dali":
        pytest.importorskip("nvidia.dali")
    loader = make_loader(extreme_folder, split="val", backend=backend, train=False, image_size=224, batch_size=8,
                         num_workers=1, max_bad_fraction=0.5)
    served = sum(len(b.indices) for b in loader)
    assert served == len(loader.dataset)
    named = {b.path.rsplit("/", 1)[-1]: b.reason for b in loader.skipped}
    assert set(named) == {"strip_0.png", "strip_1.png"} and all("100:1" in r for r in named.values()), named


def test_a_conversion_reports_them_and_packs_the_rest(extreme_folder, tmp_path):
    from datapipe import open_dataset

    report = convert(extreme_folder, tmp_path / "out.lmdb", ConvertOptions(workers=1, progress=False))
    for split in ("train", "val"):
        bad = {s["path"]: s["reason"] for s in report.splits[split].skipped}
        for k in range(2):
            assert f"{MAX_ASPECT}:1" in bad[f"{split}/cat/strip_{k}.png"], bad
        ds = open_dataset(tmp_path / "out.lmdb", split)
        assert not any("strip" in ds.record(i).key for i in range(len(ds)))
