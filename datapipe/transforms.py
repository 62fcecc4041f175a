"""The two views every backend produces, as crop boxes, and the fast CPU decode + crop + resize.

train: RandomResizedCrop(size, scale=(0.08, 1), ratio=(3/4, 4/3)) + horizontal flip (p=0.5), with
torchvision's sampling rule. eval: shorter side resized to size / 0.875, centre crop of size. The
box is in the decoded image's pixels; resizing the box to size x size is the whole transform.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass

import numpy as np
from PIL import Image

from .decode import EXIF_ORIENTATION, PLAIN_MODES, open_image, to_rgb

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


def center_crop(width: int, height: int, size: int) -> Crop:
    """The region that 'resize shorter side to size/0.875, centre-crop size' keeps."""
    side = min(width, height) * EVAL_CROP_RATIO
    return Crop((width - side) / 2, (height - side) / 2, side, side)


def sample_rng(seed: int, epoch: int, index: int) -> random.Random:
    """The augmentation randomness of one record in one epoch: independent of worker and batch."""
    return random.Random((seed * 1_000_003 + epoch) * 4_294_967_296 + index)


def _open_upright(data: bytes) -> tuple[Image.Image, bool]:
    """The opened image, and whether it may still be draft-decoded (plain JPEG, no EXIF rotation)."""
    img = open_image(data)
    plain = img.format == "JPEG" and img.mode in PLAIN_MODES and img.getexif().get(EXIF_ORIENTATION, 1) in (0, 1)
    return img, plain


def decode_view(data: bytes, size: int, *, train: bool, rng: random.Random | None = None) -> np.ndarray:
    """Decode and crop-resize to a size x size x 3 uint8 array (the one RGB rule of datapipe.decode).

    A plain JPEG is decoded in the DCT domain at the smallest 1/2..1/8 scale that keeps the crop at
    least `size` pixels, and the crop and resize happen in one resampling pass.
    """
    img, plain = _open_upright(data)
    if not plain:
        img = to_rgb(img)
    width, height = img.size
    crop = random_resized_crop(width, height, rng or random.Random(0)) if train else center_crop(width, height, size)
    if plain:
        scale = max(size / crop.width, size / crop.height)
        img.draft("RGB", (math.ceil(width * scale), math.ceil(height * scale)))
        if img.mode != "RGB":
            img = img.convert("RGB")
    sx, sy = img.width / width, img.height / height
    box = (crop.left * sx, crop.top * sy, (crop.left + crop.width) * sx, (crop.top + crop.height) * sy)
    out = img.resize((size, size), Image.Resampling.BILINEAR, box=box)
    if crop.flip:
        out = out.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return np.array(out)  # writable: torch.from_numpy takes it without a warning
