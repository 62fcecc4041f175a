"""The fast CPU decode of a view: decode + crop + resize to a 3 x size x size uint8 tensor, by the one
RGB rule of datapipe.image.decode. The views' geometry (crop boxes, resize, DCT scale) is datapipe.image.geometry;
this module is the pixel side: libjpeg-turbo (simplejpeg and the region decoder), Pillow, torch's
resize, and the per-thread decode buffers.
"""
from __future__ import annotations

import math
import os
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
import simplejpeg
import torch
import torch.nn.functional as F

from ..image import jpeg_region
from ..image.decode import exif_orientation, open_image, to_rgb, upright_image_size
from ..image.geometry import Crop, center_window, scaled_box, view_factor
from ..image.headers import Layout
from ..image.layout import jpeg_layout
from ..image.orientation import orient, stored_box, upright_size
from . import plan as planner
from .plan import SamplePlan

_jpeg_region = jpeg_region.load()  # None where it was not built or fails its probe
# DATAPIPE_REGION_DECODE=0 turns the region decoder off (whole-image decode), for A/B runs.
_region_enabled = os.environ.get("DATAPIPE_REGION_DECODE", "1") != "0"


@dataclass(frozen=True)
class Encoded:
    """An encoded image opened at its header: its upright width and height (what the planner needs)
    and how it decodes: `layout` (stored width, height, EXIF orientation) for a JPEG libjpeg-turbo
    decodes straight to the RGB rule, else the Pillow `image`, opened lazily."""

    data: bytes
    width: int
    height: int
    layout: Layout | None = None
    image: Any = None


def open_encoded(data: bytes) -> Encoded:
    """`data`'s header read (libjpeg-turbo's, else Pillow's): an Encoded to plan and decode. Raises
    for bytes no decoder opens."""
    layout = jpeg_layout(data)
    if layout:
        return Encoded(data, *upright_size(layout[0], layout[1], layout[2]), layout=layout)
    img = open_image(data)
    return Encoded(data, *upright_image_size(img), image=img)


def decode_view(encoded: Encoded, plan: SamplePlan) -> torch.Tensor:
    """Decode and crop-resize to a 3 x size x size uint8 tensor (the one RGB rule of datapipe.image.decode),
    as `plan` (datapipe.augment.plan.SamplePlan, drawn for this image's size) says: the train view's
    crop box, flip and interpolation, or the eval view at the plan's crop_pct.

    A YCbCr or grayscale JPEG goes straight to libjpeg-turbo, at 1/2, 1/4 or 1/8 scale in the DCT
    domain when the view stays sharp, and its EXIF orientation is applied to the decoded pixels.
    For the train view only the crop box is decoded (datapipe._jpeg_region, where it was built);
    otherwise the whole image is (simplejpeg: the same pixels as Pillow, measured ~1.5x faster).
    A CMYK JPEG's train view goes to the region decoder too (Pillow's CMYK -> RGB, in C). Anything
    else decodes through Pillow by the RGB rule (a CMYK JPEG at the same DCT scale). The eval view of
    an image at least twice its resize target decodes at a DCT scale too (timm's decodes whole).
    Resizing uses torch's antialiased uint8 bilinear kernel (~1.7x faster than Pillow's). train:
    the crop box is resized; eval: torchvision's order, the whole image resized to shorter side
    int(size / crop_pct), then an integer-centred crop.

    Errors follow Pillow, which validated the records at conversion: libjpeg's corrupt-data warnings
    are ignored (libjpeg decodes past them), so every accepted record decodes, in every epoch and
    whatever its crop. A stream without its end marker is decoded strictly: a truncated file fails.
    """
    data, crop, size, mode = encoded.data, plan.crop, plan.size, plan.interpolation
    width, height = encoded.width, encoded.height
    factor = view_factor(crop, width, height, size, plan.crop_pct)
    if encoded.layout:
        stored_width, stored_height, orientation = encoded.layout
        if crop and region_decoding(data):
            return _decode_crop(data, crop, encoded.layout, factor, size, mode)
        shrink = dict(min_width=math.ceil(stored_width / factor),
                      min_height=math.ceil(stored_height / factor)) if factor > 1 else {}
        pixels = simplejpeg.decode_jpeg(data, colorspace="RGB", buffer=_decode_buffer(stored_width * stored_height * 3),
                                        strict=not ends_with_eoi(data), **shrink)
        pixels = orient(pixels, orientation)
    else:
        img = encoded.image
        if crop and img.format == "JPEG" and img.mode == "CMYK" and region_decoding(data):
            return _decode_crop(data, crop, (img.width, img.height, exif_orientation(img)), factor, size, mode)
        if img.format == "JPEG" and factor > 1:  # CMYK: Pillow decodes at 1/factor too
            img.draft(img.mode, (max(1, img.width // factor), max(1, img.height // factor)))
        pixels = np.array(to_rgb(img))
    if crop:
        return resize_crop(pixels, crop, width, height, size, mode)
    return resize_center(pixels, size, plan.crop_pct, mode)


def plan_and_decode(data: bytes, recipe, seed: int, epoch: int, key: int, size: int, *,
                    train: bool) -> tuple[torch.Tensor, SamplePlan]:
    """Record `key`'s view in `epoch`: its header read, its plan drawn (the one planner call) and its
    view decoded. The plan's ops are the caller's to apply (augment.cpu)."""
    encoded = open_encoded(data)
    plan = planner.plan_sample(recipe, seed, epoch, key, size, encoded.width, encoded.height, train=train)
    return decode_view(encoded, plan), plan


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


def _decode_crop(data: bytes, crop: Crop, layout: Layout, factor: int, size: int, mode: str = "bilinear") -> torch.Tensor:
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
    return _finish_crop(orient(buf[:w * h * 3].reshape(h, w, 3), orientation), crop, size, mode)


_BUFFERS = threading.local()


def _decode_buffer(nbytes: int) -> np.ndarray:
    """This thread's reusable decode buffer, grown as needed. A fresh 0.5 MB array per image cost
    ~0.6 ms in page faults, over a third of the decode (measured); views of it never leave
    decode_view, whose resize copies the pixels out."""
    buf = getattr(_BUFFERS, "array", None)
    if buf is None or buf.size < nbytes:
        buf = _BUFFERS.array = np.empty(nbytes, dtype=np.uint8)
    return buf


def _resize(region: np.ndarray, height: int, width: int, mode: str = "bilinear") -> torch.Tensor:
    """torch's antialiased uint8 resize, bilinear or bicubic (torchvision's tensor Resize kernels)."""
    chw = torch.from_numpy(np.ascontiguousarray(region)).permute(2, 0, 1)[None]
    return F.interpolate(chw, size=(height, width), mode=mode, antialias=True, align_corners=False)[0]


def resize_center(pixels: np.ndarray, size: int, crop_pct: float = 0.875, mode: str = "bilinear") -> torch.Tensor:
    """torchvision's Resize(floor(size / crop_pct)) then CenterCrop(size): HWC uint8 in, CHW uint8 out."""
    h, w = pixels.shape[:2]
    nw, nh, left, top = center_window(w, h, size, crop_pct)
    return _resize(pixels, nh, nw, mode)[:, top:top + size, left:left + size].contiguous()


def resize_crop(pixels: np.ndarray, crop: Crop, width: int, height: int, size: int, mode: str = "bilinear") -> torch.Tensor:
    """Cut `crop` (in width x height coordinates) out of HWC `pixels` (maybe DCT-scaled), resize it
    to size x size with antialiasing, mirror it if asked: CHW uint8 (what the resize yields)."""
    left, top, right, bottom = scaled_box(crop, width, height, pixels.shape[1], pixels.shape[0])
    return _finish_crop(pixels[top:bottom, left:right], crop, size, mode)


def _finish_crop(region: np.ndarray, crop: Crop, size: int, mode: str = "bilinear") -> torch.Tensor:
    out = _resize(region, size, size, mode)
    return out.flip(-1) if crop.flip else out
