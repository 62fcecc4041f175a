"""The two views every backend produces, as arithmetic on image sizes: no pixels, no decoders, no
random draws (the planner, datapipe.augment.plan, draws the train view's crop box and flip).

train: a crop box (RandomResizedCrop's, scale=(0.08, 1), ratio=(3/4, 4/3) by default) resized to
size x size, mirrored or not. eval: shorter side resized to size / 0.875, centre crop of size. The
box is in the decoded image's pixels; resizing the box to size x size is the whole transform.

The CPU decode stack (datapipe.augment.view) and DALI's source workers share this module, so it imports
nothing but the standard library: DALI's spawned workers load no Pillow or torch through it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

EVAL_CROP_RATIO = 0.875
SCALE = (0.08, 1.0)
RATIO = (3 / 4, 4 / 3)
# The longest side at most this many times the shortest: past it the eval view (the shorter side
# resized to the output size) would cost the aspect ratio times the output's memory (a 65535 x 1 PNG
# asked for 12.9 GB at 224 px). Refused at convert (datapipe.image.decode.check_image) and at load.
MAX_ASPECT = 100


class AspectTooLarge(ValueError):
    """An image whose sides differ by more than MAX_ASPECT: its views would be unbounded."""


def check_aspect(width: int, height: int) -> None:
    """AspectTooLarge for an image longer than MAX_ASPECT times its width (or the reverse), naming both."""
    if max(width, height) > MAX_ASPECT * max(1, min(width, height)):
        raise AspectTooLarge(f"{width} x {height} pixels: sides more than {MAX_ASPECT}:1 (the eval view would "
                             f"resize it to {MAX_ASPECT}+ times the output's size); crop or drop it")


@dataclass(frozen=True)
class Crop:
    """A region (left, top, width, height) of the decoded image, and whether to mirror it."""

    left: float
    top: float
    width: float
    height: float
    flip: bool = False


@dataclass(frozen=True)
class ViewGeometry:
    """A view as a decoder with a region-of-interest, a resize and a slice performs it (DALI):
    decode `roi` (left, top, width, height), resize it to `resized` (width, height), cut the
    size x size square at `window` (left, top), mirror if `flip`. The same pixels as decode_view."""

    roi: tuple[int, int, int, int]
    resized: tuple[int, int]
    window: tuple[int, int]
    flip: bool
    interpolation: str = "bilinear"  # of the resize: bilinear or bicubic (antialiased)


def eval_resize(size: int, crop_pct: float = EVAL_CROP_RATIO) -> int:
    """The shorter side before the eval centre crop, floor(size / crop_pct) as timm: 256 for 224 at
    0.875 (torchvision's recipe), 232 at 224/232 (its V2 recipe)."""
    return int(math.floor(size / crop_pct + 1e-9))


def center_window(width: int, height: int, size: int, crop_pct: float = EVAL_CROP_RATIO) -> tuple[int, int, int, int]:
    """The eval view's geometry, computed once for every backend: the resized (width, height) with
    the shorter side floor(size / crop_pct), and the integer (left, top) of the size x size centre crop."""
    check_aspect(width, height)
    short = eval_resize(size, crop_pct)
    nh, nw = (int(short * height / width), short) if width <= height else (short, int(short * width / height))
    return nw, nh, int(round((nw - size) / 2)), int(round((nh - size) / 2))


def view_of(plan, width: int, height: int) -> ViewGeometry:
    """A record's planned view (datapipe.augment.plan.SamplePlan) of a width x height (upright) image
    as a decoder with a region of interest performs it: the train view's crop box resized to the
    output, or the eval view's resize and centre window."""
    size, crop = plan.size, plan.crop
    if crop is not None:
        box = (int(crop.left), int(crop.top), int(crop.width), int(crop.height))
        return ViewGeometry(box, (size, size), (0, 0), crop.flip, plan.interpolation)
    nw, nh, left, top = center_window(width, height, size, plan.crop_pct)
    return ViewGeometry((0, 0, width, height), (nw, nh), (left, top), False, plan.interpolation)


def crop_pct_of(recipe) -> float:
    """The recipe's eval crop_pct (the default's: 0.875)."""
    return EVAL_CROP_RATIO if recipe is None else recipe.crop_pct


def scaled_box(crop: Crop, width: int, height: int, scaled_width: int, scaled_height: int) -> tuple[int, int, int, int]:
    """`crop` (in width x height coordinates) as integer (left, top, right, bottom) pixels of the
    image decoded at scaled_width x scaled_height, never empty."""
    sx, sy = scaled_width / width, scaled_height / height
    left, top = int(crop.left * sx), int(crop.top * sy)
    right = max(left + 1, min(scaled_width, round((crop.left + crop.width) * sx)))
    bottom = max(top + 1, min(scaled_height, round((crop.top + crop.height) * sy)))
    return left, top, right, bottom


def dct_factor(scale: float) -> int:
    """The largest of 1, 2, 4, 8 whose 1/f still keeps the crop at least `size` (scale = size / crop)."""
    factor = 1
    while factor < 8 and 1 / (factor * 2) >= scale:
        factor *= 2
    return factor


def view_factor(crop: Crop | None, width: int, height: int, size: int, crop_pct: float = EVAL_CROP_RATIO) -> int:
    """The DCT scale denominator a view of a width x height (upright) image may decode at."""
    need = max(size / crop.width, size / crop.height) if crop else eval_resize(size, crop_pct) / min(width, height)
    return dct_factor(need)
