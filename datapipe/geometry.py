"""The two views every backend produces, as arithmetic on image sizes: no pixels, no decoders.

train: RandomResizedCrop(size, scale=(0.08, 1), ratio=(3/4, 4/3)) + horizontal flip (p=0.5), with
torchvision's sampling rule. eval: shorter side resized to size / 0.875, centre crop of size. The
box is in the decoded image's pixels; resizing the box to size x size is the whole transform.

The CPU decode stack (datapipe.transforms) and DALI's source workers share this module, so it imports
nothing but the standard library: DALI's spawned workers stay free of Pillow, numpy and torch here.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass

EVAL_CROP_RATIO = 0.875
SCALE = (0.08, 1.0)
RATIO = (3 / 4, 4 / 3)


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


def random_resized_crop(width: int, height: int, rng: random.Random) -> Crop:
    """torchvision's RandomResizedCrop sampling: 10 tries of (area, log-ratio), then a centre fallback."""
    area = width * height
    log_ratio = (math.log(RATIO[0]), math.log(RATIO[1]))
    for _ in range(10):
        target = area * rng.uniform(*SCALE)
        aspect = math.exp(rng.uniform(*log_ratio))
        w, h = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            return Crop(rng.randint(0, width - w), rng.randint(0, height - h), w, h, rng.random() < 0.5)
    in_ratio = width / height
    if in_ratio < RATIO[0]:
        w, h = width, round(width / RATIO[0])
    elif in_ratio > RATIO[1]:
        w, h = round(height * RATIO[1]), height
    else:
        w, h = width, height
    return Crop((width - w) // 2, (height - h) // 2, w, h, rng.random() < 0.5)


def sample_rng(seed: int, epoch: int, index: int) -> random.Random:
    """The augmentation randomness of one record in one epoch: independent of worker and batch."""
    return random.Random((seed * 1_000_003 + epoch) * 4_294_967_296 + index)


def eval_resize(size: int) -> int:
    """The shorter side before the eval centre crop: 256 for 224, as torchvision's recipe."""
    return int(size / EVAL_CROP_RATIO)


def center_window(width: int, height: int, size: int) -> tuple[int, int, int, int]:
    """The eval view's geometry, computed once for every backend: the resized (width, height) with
    the shorter side int(size / 0.875), and the integer (left, top) of the size x size centre crop."""
    short = eval_resize(size)
    nh, nw = (int(short * height / width), short) if width <= height else (short, int(short * width / height))
    return nw, nh, int(round((nw - size) / 2)), int(round((nh - size) / 2))


def view_of(width: int, height: int, size: int, *, train: bool, rng: random.Random | None = None) -> ViewGeometry:
    """The view of a width x height (upright) image with this rng: the train view's random crop box
    (torchvision's RandomResizedCrop rule) and flip, or the eval view's resize and centre window."""
    if train:
        c = random_resized_crop(width, height, rng or random.Random(0))
        return ViewGeometry((int(c.left), int(c.top), int(c.width), int(c.height)), (size, size), (0, 0), c.flip)
    nw, nh, left, top = center_window(width, height, size)
    return ViewGeometry((0, 0, width, height), (nw, nh), (left, top), False)


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


def view_factor(crop: Crop | None, width: int, height: int, size: int) -> int:
    """The DCT scale denominator a view of a width x height (upright) image may decode at."""
    need = max(size / crop.width, size / crop.height) if crop else eval_resize(size) / min(width, height)
    return dct_factor(need)
