"""The two views every backend produces, as crop boxes, and the fast CPU decode + crop + resize.

train: RandomResizedCrop(size, scale=(0.08, 1), ratio=(3/4, 4/3)) + horizontal flip (p=0.5), with
torchvision's sampling rule. eval: shorter side resized to size / 0.875, centre crop of size. The
box is in the decoded image's pixels; resizing the box to size x size is the whole transform.
"""
from __future__ import annotations

import math
import os
import random
import threading
from dataclasses import dataclass

import numpy as np
import simplejpeg
import torch
import torch.nn.functional as F
from PIL import Image

from . import jpeg_region
from .decode import exif_orientation, open_image, to_rgb, upright_image_size
from .orientation import orient, stored_box, upright_size

_jpeg_region = jpeg_region.load()  # None where it was not built or fails its probe
# DATAPIPE_REGION_DECODE=0 turns the region decoder off (whole-image decode), for A/B runs.
_region_enabled = os.environ.get("DATAPIPE_REGION_DECODE", "1") != "0"

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


def sample_rng(seed: int, epoch: int, index: int) -> random.Random:
    """The augmentation randomness of one record in one epoch: independent of worker and batch."""
    return random.Random((seed * 1_000_003 + epoch) * 4_294_967_296 + index)


JpegLayout = tuple[int, int, int]  # stored width, stored height, EXIF orientation


def _jpeg_layout(data: bytes) -> JpegLayout | None:
    """(stored width, stored height, EXIF orientation) when libjpeg-turbo may decode `data` straight
    to the RGB rule (a YCbCr or grayscale JPEG within Pillow's pixel limit; the orientation is
    applied to the decoded pixels). Else None: Pillow decodes it. Pillow is opened only when an EXIF
    segment exists."""
    if not data.startswith(b"\xff\xd8\xff"):
        return None
    try:
        height, width, colorspace, _ = simplejpeg.decode_jpeg_header(data)
    except ValueError:
        return None
    if colorspace not in ("YCbCr", "Gray") or width * height > Image.MAX_IMAGE_PIXELS:
        return None
    orientation = exif_orientation(open_image(data)) if b"Exif\x00\x00" in data[:65536] else 1
    return width, height, orientation


def _dct_factor(scale: float) -> int:
    """The largest of 1, 2, 4, 8 whose 1/f still keeps the crop at least `size` (scale = size / crop)."""
    factor = 1
    while factor < 8 and 1 / (factor * 2) >= scale:
        factor *= 2
    return factor


def _view_factor(crop: Crop | None, width: int, height: int, size: int) -> int:
    """The DCT scale denominator a view of a width x height (upright) image may decode at."""
    need = max(size / crop.width, size / crop.height) if crop else eval_resize(size) / min(width, height)
    return _dct_factor(need)


def decode_view(data: bytes, size: int, *, train: bool, rng: random.Random | None = None) -> torch.Tensor:
    """Decode and crop-resize to a 3 x size x size uint8 tensor (the one RGB rule of datapipe.decode).

    A YCbCr or grayscale JPEG goes straight to libjpeg-turbo, at 1/2, 1/4 or 1/8 scale in the DCT
    domain when the view stays sharp, and its EXIF orientation is applied to the decoded pixels.
    For the train view only the crop box is decoded (datapipe._jpeg_region, where it was built);
    otherwise the whole image is (simplejpeg: the same pixels as Pillow, measured ~1.5x faster).
    A CMYK JPEG's train view goes to the region decoder too (Pillow's CMYK -> RGB, in C). Anything
    else decodes through Pillow by the RGB rule (a CMYK JPEG at the same DCT scale).
    Resizing uses torch's antialiased uint8 bilinear kernel (~1.7x faster than Pillow's). train:
    the crop box is resized; eval: torchvision's order, the whole image resized to shorter side
    int(size / 0.875), then an integer-centred crop.

    Errors follow Pillow, which validated the records at conversion: libjpeg's corrupt-data warnings
    are ignored (libjpeg decodes past them), so every accepted record decodes, in every epoch and
    whatever its crop. A stream without its end marker is decoded strictly: a truncated file fails.
    """
    rng = rng or random.Random(0)
    layout = _jpeg_layout(data)
    if layout:
        stored_width, stored_height, orientation = layout
        width, height = upright_size(stored_width, stored_height, orientation)
        crop = random_resized_crop(width, height, rng) if train else None
        factor = _view_factor(crop, width, height, size)
        if crop and region_decoding(data):
            return _decode_crop(data, crop, layout, factor, size)
        shrink = dict(min_width=math.ceil(stored_width / factor),
                      min_height=math.ceil(stored_height / factor)) if factor > 1 else {}
        pixels = simplejpeg.decode_jpeg(data, colorspace="RGB", buffer=_decode_buffer(stored_width * stored_height * 3),
                                        strict=not ends_with_eoi(data), **shrink)
        pixels = orient(pixels, orientation)
    else:
        img = open_image(data)
        width, height = upright_image_size(img)
        crop = random_resized_crop(width, height, rng) if train else None
        factor = _view_factor(crop, width, height, size)
        if crop and img.format == "JPEG" and img.mode == "CMYK" and region_decoding(data):
            return _decode_crop(data, crop, (img.width, img.height, exif_orientation(img)), factor, size)
        if img.format == "JPEG" and factor > 1:  # CMYK: Pillow decodes at 1/factor too
            img.draft(img.mode, (max(1, img.width // factor), max(1, img.height // factor)))
        pixels = np.array(to_rgb(img))
    return resize_crop(pixels, crop, width, height, size) if crop else resize_center(pixels, size)


def region_decoder_available() -> bool:
    """Whether datapipe._jpeg_region was compiled (it needs libjpeg headers at install) and
    passed its probe."""
    return _jpeg_region is not None


def set_region_decoding(enabled: bool) -> bool:
    """Turn the region decoder on or off in this process (and workers forked later); returns the
    previous setting. Off, the train view decodes whole images: the same pixels, slower."""
    global _region_enabled
    previous, _region_enabled = _region_enabled, enabled
    return previous


def ends_with_eoi(data: bytes) -> bool:
    """Whether a JPEG stream ends in its end-of-image marker, as a complete one does (0xFFD9 cannot
    occur inside entropy data). Files with bytes after the marker exist; they are decoded strictly."""
    return data[-2:] == b"\xff\xd9"


def region_decoding(data: bytes) -> bool:
    """Whether the crop of a plain JPEG may be decoded alone: the region decoder is built and on,
    and the stream is complete. The region decoder never reads the rows below the crop, so a
    truncated file goes to the strict whole-image decode, which reports it every time."""
    return _region_enabled and _jpeg_region is not None and ends_with_eoi(data)


def _decode_crop(data: bytes, crop: Crop, layout: JpegLayout, factor: int, size: int) -> torch.Tensor:
    """The train view from the crop box alone, decoded at 1/factor and turned upright: the same
    pixels resize_crop cuts from a whole-image decode (tested), less decode time (the decode suite
    of `datapipe bench` times both)."""
    stored_width, stored_height, orientation = layout
    scaled = math.ceil(stored_width / factor), math.ceil(stored_height / factor)
    box = scaled_box(crop, *upright_size(stored_width, stored_height, orientation),
                     *upright_size(*scaled, orientation))
    left, top, right, bottom = stored_box(box, orientation, *scaled)
    w, h = right - left, bottom - top
    buf = _decode_buffer(_jpeg_region.region_buffer_size(w, h))
    _jpeg_region.decode_region(data, factor, left, top, w, h, buf)
    return _finish_crop(orient(buf[:w * h * 3].reshape(h, w, 3), orientation), crop, size)


_BUFFERS = threading.local()


def _decode_buffer(nbytes: int) -> np.ndarray:
    """This thread's reusable decode buffer, grown as needed. A fresh 0.5 MB array per image cost
    ~0.6 ms in page faults, over a third of the decode (measured); views of it never leave
    decode_view, whose resize copies the pixels out."""
    buf = getattr(_BUFFERS, "array", None)
    if buf is None or buf.size < nbytes:
        buf = _BUFFERS.array = np.empty(nbytes, dtype=np.uint8)
    return buf


def eval_resize(size: int) -> int:
    """The shorter side before the eval centre crop: 256 for 224, as torchvision's recipe."""
    return int(size / EVAL_CROP_RATIO)


def _resize(region: np.ndarray, height: int, width: int) -> torch.Tensor:
    chw = torch.from_numpy(np.ascontiguousarray(region)).permute(2, 0, 1)[None]
    return F.interpolate(chw, size=(height, width), mode="bilinear", antialias=True, align_corners=False)[0]


def center_window(width: int, height: int, size: int) -> tuple[int, int, int, int]:
    """The eval view's geometry, computed once for every backend: the resized (width, height) with
    the shorter side int(size / 0.875), and the integer (left, top) of the size x size centre crop."""
    short = eval_resize(size)
    nh, nw = (int(short * height / width), short) if width <= height else (short, int(short * width / height))
    return nw, nh, int(round((nw - size) / 2)), int(round((nh - size) / 2))


def resize_center(pixels: np.ndarray, size: int) -> torch.Tensor:
    """torchvision's Resize(int(size / 0.875)) then CenterCrop(size): HWC uint8 in, CHW uint8 out."""
    h, w = pixels.shape[:2]
    nw, nh, left, top = center_window(w, h, size)
    return _resize(pixels, nh, nw)[:, top:top + size, left:left + size].contiguous()


@dataclass(frozen=True)
class ViewGeometry:
    """A view as a decoder with a region-of-interest, a resize and a slice performs it (DALI):
    decode `roi` (left, top, width, height), resize it to `resized` (width, height), cut the
    size x size square at `window` (left, top), mirror if `flip`. The same pixels as decode_view."""

    roi: tuple[int, int, int, int]
    resized: tuple[int, int]
    window: tuple[int, int]
    flip: bool


def image_dims(data: bytes) -> tuple[int, int]:
    """(width, height) of an image as the RGB rule decodes it (EXIF rotation applied), from its
    header alone."""
    layout = _jpeg_layout(data)
    if layout:
        return upright_size(*layout)
    img = open_image(data)
    return upright_image_size(img)


def view_geometry(data: bytes, size: int, *, train: bool, rng: random.Random | None = None) -> ViewGeometry:
    """The geometry decode_view applies to `data` with this rng: the train view's random crop box
    (torchvision's RandomResizedCrop rule) and flip, or the eval view's resize and centre window."""
    width, height = image_dims(data)
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


def resize_crop(pixels: np.ndarray, crop: Crop, width: int, height: int, size: int) -> torch.Tensor:
    """Cut `crop` (in width x height coordinates) out of HWC `pixels` (maybe DCT-scaled), resize it
    to size x size with antialiasing, mirror it if asked: CHW uint8 (what the resize yields)."""
    left, top, right, bottom = scaled_box(crop, width, height, pixels.shape[1], pixels.shape[0])
    return _finish_crop(pixels[top:bottom, left:right], crop, size)


def _finish_crop(region: np.ndarray, crop: Crop, size: int) -> torch.Tensor:
    out = _resize(region, size, size)
    return out.flip(-1) if crop.flip else out
