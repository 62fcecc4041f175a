"""The torch appliers against the PIL operations timm calls (ImageOps, ImageEnhance, Image.transform),
op by op, on a real photo crop: point ops exact, blends within a level, affine warps within the
measured tolerance (docs/augmentation.md#tolerances)."""
from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image, ImageEnhance, ImageOps

from datapipe.augment.cpu import apply_ops
from datapipe.augment.ops import KIND_ID

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "imagefolder"
FILL = (124, 116, 104)


@pytest.fixture(scope="module")
def photo() -> Image.Image:
    """A 96 x 80 RGB crop of a fixture photo, with some structure in every channel."""
    path = next(p for p in sorted(FIXTURES.rglob("*.jpg")) if p.stat().st_size > 2000)
    with Image.open(io.BytesIO(path.read_bytes())) as img:
        return img.convert("RGB").resize((96, 80), Image.BILINEAR)


def ours(img: Image.Image, kind: str, value: float = 0.0) -> np.ndarray:
    tensor = torch.from_numpy(np.asarray(img).copy()).permute(2, 0, 1).contiguous()
    return apply_ops(tensor, [(KIND_ID[kind], value)], fill=FILL).permute(1, 2, 0).numpy()


def pil_affine(img: Image.Image, matrix) -> np.ndarray:
    return np.asarray(img.transform(img.size, Image.AFFINE, matrix, resample=Image.BILINEAR, fillcolor=FILL))


def solarize_add(img: Image.Image, add: int) -> Image.Image:
    lut = [min(255, i + add) if i < 128 else i for i in range(256)]
    return img.point(lut * 3)


EXACT = [
    ("auto_contrast", 0, lambda im: ImageOps.autocontrast(im)),
    ("equalize", 0, lambda im: ImageOps.equalize(im)),
    ("invert", 0, lambda im: ImageOps.invert(im)),
    ("posterize", 2, lambda im: ImageOps.posterize(im, 2)),
    ("posterize", 5, lambda im: ImageOps.posterize(im, 5)),
    ("posterize", 8, lambda im: im),
    ("solarize", 100, lambda im: ImageOps.solarize(im, 100)),
    ("solarize", 256, lambda im: ImageOps.solarize(im, 256)),
    ("solarize_add", 60, lambda im: solarize_add(im, 60)),
    ("vflip", 0, lambda im: ImageOps.flip(im)),
    ("grayscale", 0, lambda im: im.convert("L").convert("RGB")),
]


@pytest.mark.parametrize("kind,value,reference", EXACT, ids=[f"{k}-{v}" for k, v, _ in EXACT])
def test_point_ops_equal_pil(photo, kind, value, reference):
    assert np.array_equal(ours(photo, kind, value), np.asarray(reference(photo)))


BLENDS = [("brightness", ImageEnhance.Brightness), ("color", ImageEnhance.Color),
          ("contrast", ImageEnhance.Contrast), ("sharpness", ImageEnhance.Sharpness)]


@pytest.mark.parametrize("kind,enhancer", BLENDS, ids=[k for k, _ in BLENDS])
@pytest.mark.parametrize("factor", [0.1, 0.55, 1.0, 1.45, 1.9])
def test_enhance_ops_within_one_level_of_pil(photo, kind, enhancer, factor):
    diff = np.abs(ours(photo, kind, factor).astype(int) - np.asarray(enhancer(photo).enhance(factor)).astype(int))
    assert diff.max() <= 1, (kind, factor, diff.max())


def rotation(img: Image.Image, degrees: float) -> np.ndarray:
    return np.asarray(img.rotate(degrees, resample=Image.BILINEAR, fillcolor=FILL))


AFFINE = [
    ("rotate", 30.0, lambda im: rotation(im, 30.0)),
    ("rotate", -17.5, lambda im: rotation(im, -17.5)),
    ("shear_x", 0.3, lambda im: pil_affine(im, (1, 0.3, 0, 0, 1, 0))),
    ("shear_y", -0.21, lambda im: pil_affine(im, (1, 0, 0, -0.21, 1, 0))),
    ("translate_x", 20.5, lambda im: pil_affine(im, (1, 0, 20.5, 0, 1, 0))),
    ("translate_y", -13.0, lambda im: pil_affine(im, (1, 0, 0, 0, 1, -13.0))),
]
# the torch fallback (affine_grid + grid_sample, float32, where datapipe._warp was not built) against
# Pillow's bilinear AFFINE: mean |diff| 0-0.25 levels measured, a border pixel at most off by more
AFFINE_MEAN_LEVELS, AFFINE_FAR_SHARE = 0.5, 0.01


@pytest.mark.parametrize("kind,value,reference", AFFINE, ids=[f"{k}{v}" for k, v, _ in AFFINE])
def test_affine_ops_are_pils(photo, kind, value, reference):
    """The compiled warp (datapipe._warp) gives Pillow's values exactly; the torch fallback, close."""
    from datapipe.augment import cpu_kernels as cpu

    assert cpu._warp is not None, "datapipe._warp was not built (setup.py's optional extension)"
    assert np.array_equal(ours(photo, kind, value), reference(photo))


@pytest.mark.parametrize("kind,value,reference", AFFINE, ids=[f"{k}{v}" for k, v, _ in AFFINE])
def test_the_torch_fallback_warp_is_near_pil(photo, kind, value, reference, monkeypatch):
    from datapipe.augment import cpu_kernels as cpu

    monkeypatch.setattr(cpu, "_warp", None)
    diff = np.abs(ours(photo, kind, value).astype(int) - reference(photo).astype(int))
    assert diff.mean() <= AFFINE_MEAN_LEVELS and (diff > 2).mean() <= AFFINE_FAR_SHARE, (diff.mean(), (diff > 2).mean())


def test_ops_apply_in_order(photo):
    """invert then solarize differs from solarize then invert: the plan's order is kept."""
    tensor = torch.from_numpy(np.asarray(photo).copy()).permute(2, 0, 1).contiguous()
    a = apply_ops(tensor, [(KIND_ID["invert"], 0), (KIND_ID["solarize"], 128)])
    b = apply_ops(tensor, [(KIND_ID["solarize"], 128), (KIND_ID["invert"], 0)])
    assert not torch.equal(a, b)
    assert torch.equal(apply_ops(tensor, [(KIND_ID["identity"], 5.0)]), tensor)
