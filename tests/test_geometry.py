"""The views' arithmetic (datapipe.image.geometry) apart from the pixels, and what DALI's source workers load.

DALI's parallel external source runs datapipe.backends.dali.source in spawned worker processes that
only read records and compute views: they must not load Pillow or simplejpeg (issue 24, part 5).
"""
from __future__ import annotations

import ast
import json
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from datapipe.augment.plan import plan_sample, random_resized_crop, sample_rng
from datapipe.image.geometry import Crop, ViewGeometry, center_window, dct_factor, scaled_box, view_factor, view_of
from tests.conftest import IMAGEFOLDER

ROOT = Path(__file__).resolve().parents[1]
JPEG = IMAGEFOLDER / "train/cat/exif_rotated.jpg"  # EXIF orientation 6: stored 80 x 60, upright 60 x 80
PNG = IMAGEFOLDER / "train/dog/palette.png"
HEAVY = ("PIL", "simplejpeg")


def test_views_are_the_arithmetic_they_were_before_the_split():
    """Values pinned from datapipe.augment.view as it was (commit ed3a23d): moving the code changed nothing."""
    assert center_window(640, 480, 224) == (341, 256, 58, 16)
    assert center_window(333, 500, 224) == (256, 384, 16, 80)
    assert center_window(97, 1000, 64) == (73, 752, 4, 344)
    assert random_resized_crop(640, 480, sample_rng(3, 2, 17)) == Crop(49, 18, 449, 345, True)
    assert random_resized_crop(50, 1000, sample_rng(0, 0, 0)) == Crop(0, 466, 50, 67, True)  # the centre fallback
    assert (view_factor(None, 2000, 1500, 224), view_factor(Crop(0, 0, 900, 1000), 2000, 1500, 224)) == (4, 4)
    assert dct_factor(0.3) == 2
    assert scaled_box(Crop(10.5, 20, 300, 200, True), 640, 480, 160, 120) == (2, 5, 78, 55)
    train = ViewGeometry((19, 0, 31, 35), (32, 32), (0, 0), True)
    assert view_of(plan_sample(None, 0, 1, 5, 32, 60, 80), 60, 80) == train
    assert view_of(plan_sample(None, 0, 1, 5, 32, 60, 80, train=False), 60, 80) == ViewGeometry(
        (0, 0, 60, 80), (36, 48), (2, 8), False)


@pytest.mark.parametrize("module", ["geometry", "headers", "exif"])
def test_geometry_and_the_header_reader_import_only_the_standard_library(module):
    """What the DALI side needs is pure Python: no Pillow, numpy, torch or simplejpeg behind it."""
    tree = ast.parse((ROOT / "datapipe" / "image" / f"{module}.py").read_text())
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 0}
    assert {name.split(".")[0] for name in names} <= sys.stdlib_module_names, names
    ours = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 1}
    assert ours <= {"geometry", "headers", "exif"}, ours


def _fresh_python(code: str) -> dict:
    """Run `code` in a new interpreter (as a spawned worker starts) and return the JSON it prints last."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_dali_source_worker_loads_no_pillow_while_it_computes_views():
    """A fresh interpreter imports what a DALI source worker imports and computes the train and eval
    views of an EXIF-rotated JPEG and a palette PNG: the geometry the CPU path uses, and neither
    Pillow nor simplejpeg in sys.modules before or after."""
    code = f"""
import json, sys
import datapipe.backends.dali.source
before = [m for m in {HEAVY!r} if m in sys.modules]
from datapipe.augment.plan import plan_sample
from datapipe.image.geometry import view_of
from datapipe.image.layout import image_dims
views = {{}}
for path in ({str(JPEG)!r}, {str(PNG)!r}):
    dims = image_dims(open(path, "rb").read())
    views[path] = [view_of(plan_sample(None, 0, 1, 5, 32, *dims, train=train), *dims).__dict__ for train in (True, False)]
print(json.dumps({{"before": before, "after": [m for m in {HEAVY!r} if m in sys.modules], "views": views}}))
"""
    result = _fresh_python(code)
    assert result["before"] == [] and result["after"] == [], result
    for path, upright in ((JPEG, (60, 80)), (PNG, (96, 72))):
        expected = [view_of(plan_sample(None, 0, 1, 5, 32, *upright, train=train), *upright) for train in (True, False)]
        assert result["views"][str(path)] == [json.loads(json.dumps(v.__dict__)) for v in expected]


def test_a_pickled_dali_source_prepares_records_in_a_fresh_process_without_pillow(clean_folder):
    """The real worker's path: DaliLoader's source, pickled as DALI hands it to a spawned worker,
    prepares every record of an unconverted folder (structure check, header read, view) without
    loading Pillow or simplejpeg, and gives the geometry rows the parent computes."""
    pytest.importorskip("nvidia.dali")
    from datapipe import make_loader

    loader = make_loader(clean_folder, backend="dali", device="cpu", batch_size=4, image_size=32, num_workers=1)
    blob = pickle.dumps(loader.source)
    indices = list(range(len(loader.dataset)))
    expected = [[np.asarray(a).tolist() for a in loader.source.prepare(1, i)[2].values()] for i in indices]
    code = f"""
import json, pickle, sys
import numpy as np
source = pickle.loads({blob!r})
rows = [[np.asarray(a).tolist() for a in source.prepare(1, i)[2].values()] for i in {indices!r}]
print(json.dumps({{"heavy": [m for m in {HEAVY!r} if m in sys.modules], "rows": rows}}))
"""
    result = _fresh_python(code)
    assert result["heavy"] == []
    assert result["rows"] == expected
    assert any(loader.dataset.origin(i).endswith(".png") for i in indices)  # a PNG was among them
