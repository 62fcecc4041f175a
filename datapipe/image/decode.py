"""CPU image decode with one RGB rule for every backend, and the converters' validator.

The rule: EXIF orientation applied, CMYK/palette/alpha/16-bit converted to 8-bit RGB the way
`to_rgb` does. What is stored (`awkward`):
- "original" (default): the original bytes of every JPEG (RGB, grayscale or CMYK, EXIF-rotated or
  not) and PNG (RGB, grayscale, palette, RGBA); datapipe's backends apply the rule when they decode
  (tested: DALI's decoders and `to_rgb` give the same pixels). Only images no backend reads by the
  rule (16-bit, other modes, other formats) become lossless PNGs of their `to_rgb` pixels.
- "png": every image that is not 8-bit RGB/grayscale without an EXIF rotation becomes a lossless RGB
  PNG, so any other decoder (the webdataset library, a plain PIL `open`) reads it by the rule too:
  bigger and slower to load (a CMYK JPEG decodes ~2x faster than its RGB PNG).
"""
from __future__ import annotations

import io
import warnings
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from .exif import EXIF_ORIENTATION
from .geometry import AspectTooLarge, check_aspect
from .headers import BadImageError, image_ext, jpeg_scan_start
from .jpeg_markers import skeleton
from .orientation import upright_size

PLAIN_MODES = ("RGB", "L")
# modes whose original bytes every backend decodes by the rule (awkward="original")
ORIGINAL_MODES = {"jpg": ("RGB", "L", "CMYK"), "png": ("RGB", "L", "P", "RGBA")}
VALIDATION = ("decode", "fast")
AWKWARD = ("original", "png")


@dataclass(frozen=True)
class Checked:
    """A validated image: the bytes to store, their extension, and what was done to them."""

    data: bytes
    ext: str
    width: int
    height: int
    converted: str  # "" when the original bytes are stored, else why they were re-encoded


def to_rgb(img: Image.Image) -> Image.Image:
    """8-bit RGB with EXIF orientation applied: the one pixel rule every backend follows."""
    img = ImageOps.exif_transpose(img) or img
    if img.mode in ("I;16", "I;16B", "I;16L", "I;16N", "I"):
        wide = np.asarray(img, dtype=np.uint32)
        scale = 257 if img.mode.startswith("I;16") or wide.max(initial=0) > 255 else 1
        img = Image.fromarray((wide // scale).clip(0, 255).astype(np.uint8), "L")
    if img.mode == "F":
        img = Image.fromarray(np.asarray(img).clip(0, 255).astype(np.uint8), "L")
    return img if img.mode == "RGB" else img.convert("RGB")


def exif_orientation(img: Image.Image) -> int:
    """The EXIF orientation tag (1 = upright) of an opened image."""
    return img.getexif().get(EXIF_ORIENTATION, 1) or 1


def upright_image_size(img: Image.Image) -> tuple[int, int]:
    """(width, height) of an opened image as the rule decodes it (EXIF rotation applied)."""
    return upright_size(*img.size, exif_orientation(img))


def _needs_conversion(img: Image.Image, ext: str | None, awkward: str) -> str:
    """'' when the original bytes are stored, else why the image becomes an RGB PNG."""
    if ext is None:
        return f"{img.format or 'unknown'} stored as PNG"
    keep = ORIGINAL_MODES[ext] if awkward == "original" else PLAIN_MODES
    if img.mode not in keep:
        return f"{img.mode} converted to RGB PNG"
    if exif_orientation(img) != 1 and (awkward == "png" or ext == "png"):
        return "EXIF rotation applied, stored as PNG"
    return ""


def open_image(data: bytes, max_pixels: int | None = Image.MAX_IMAGE_PIXELS) -> Image.Image:
    """Open (not decode) encoded bytes; BadImageError for empty input, non-images and images over
    `max_pixels` (Pillow's own limit by default, where Pillow itself only warns)."""
    if not data:
        raise BadImageError("empty file (0 bytes)")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data))
            if max_pixels is not None and img.width * img.height > max_pixels:
                raise BadImageError(
                    f"decompression bomb: {img.width}x{img.height} = {img.width * img.height} pixels "
                    f"exceeds the limit of {max_pixels}")
            return img
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise BadImageError(f"decompression bomb: {exc}") from None
    except UnidentifiedImageError:
        raise BadImageError("not an image (Pillow cannot identify it)") from None
    except (OSError, SyntaxError, ValueError, EOFError) as exc:  # e.g. a file cut inside its header
        raise BadImageError(f"corrupt or truncated header: {exc}") from None


def _encode(img: Image.Image, fmt: str, **params) -> bytes:
    out = io.BytesIO()
    img.save(out, fmt, **params)
    return out.getvalue()


def _check_jpeg_fast(data: bytes) -> None:
    """Truncation check without decoding: an EOI marker must follow the first scan. FF D9 cannot
    occur inside entropy-coded data (byte stuffing), and PIL rejects a JPEG that lacks it."""
    start = jpeg_scan_start(data)
    if start < 0:
        raise BadImageError("corrupt: JPEG header has no scan")
    if data.rfind(b"\xff\xd9") < start:
        raise BadImageError("corrupt or truncated: JPEG ends before its end-of-image marker")


def check_image(data: bytes, *, max_pixels: int | None = Image.MAX_IMAGE_PIXELS,
                resize_max: int | None = None, quality: int = 90, validate: str = "decode",
                awkward: str = "original") -> Checked:
    """Validate encoded bytes and return what to store; BadImageError says why an input is unusable.

    validate="decode": a JPEG must decode with Pillow (libjpeg-turbo) at 1/8 scale, given the whole
    stream; the decode runs on its marker skeleton, which gives the same verdict in a tenth of the
    time (libjpeg only warns about bad entropy-coded data; see jpeg_markers). validate="fast": a
    JPEG's header is parsed and its end-of-image marker checked (catches truncation, not a broken
    marker after the first scan). Other formats always decode fully. `awkward`: which images keep
    their original bytes (see the module docstring).
    """
    if validate not in VALIDATION:
        raise ValueError(f"validate must be one of {VALIDATION}, got {validate!r}")
    if awkward not in AWKWARD:
        raise ValueError(f"awkward must be one of {AWKWARD}, got {awkward!r}")
    img = open_image(data, max_pixels)
    try:
        check_aspect(*upright_image_size(img))
    except AspectTooLarge as exc:
        raise BadImageError(f"unusable shape: {exc}") from None
    try:
        if resize_max is not None:  # the re-encode decodes every byte: it is the validation too
            return _reencode(data, resize_max, quality)
    except (OSError, SyntaxError, ValueError) as exc:
        raise BadImageError(f"corrupt or truncated: {exc}") from None
    ext = image_ext(data)
    width, height = upright_image_size(img)
    jpeg = ext == "jpg" and img.mode in ORIGINAL_MODES["jpg"]
    if jpeg and validate == "fast":
        _check_jpeg_fast(data)
        if not _needs_conversion(img, ext, awkward):
            return Checked(data, ext, width, height, "")
    try:
        _decode_for_validation(img, data if jpeg else None)
    except (OSError, SyntaxError, ValueError) as exc:
        raise BadImageError(f"corrupt or truncated: {exc}") from None
    converted = _needs_conversion(img, ext, awkward)
    if not converted:
        return Checked(data, ext, width, height, "")
    img = to_rgb(Image.open(io.BytesIO(data)))
    return Checked(_encode(img, "PNG", compress_level=3), "png", img.width, img.height, converted)


def _decode_for_validation(img: Image.Image, jpeg: bytes | None) -> None:
    """Decode an opened image the way the validation does; Pillow's exception when it fails.

    A JPEG decodes at 1/8 scale from its marker skeleton where it has one (the same verdict, see
    jpeg_markers), and Pillow is handed the whole stream in one read, as libjpeg-based loaders are:
    Pillow reads 64 KiB at a time and stops once the last row is out, so an error in the markers
    after the last scan passed or failed by where a read happened to end.
    """
    if jpeg is not None:
        stripped = skeleton(jpeg)
        if stripped is not None:
            img = Image.open(io.BytesIO(stripped))
        img.decodermaxblock = max(img.decodermaxblock, len(stripped or jpeg))
        img.draft(img.mode, (max(1, img.width // 8), max(1, img.height // 8)))
    img.load()


def _reencode(data: bytes, resize_max: int, quality: int) -> Checked:
    """Decode, apply the RGB rule, shrink so the shorter side is at most resize_max, save as JPEG."""
    img = Image.open(io.BytesIO(data))
    short = min(img.size)
    if short > resize_max and img.format == "JPEG":
        scale = resize_max / short
        img.draft("RGB", (int(img.width * scale) + 1, int(img.height * scale) + 1))
    img = to_rgb(img)
    short = min(img.size)
    if short > resize_max:
        w, h = img.size
        img = img.resize((max(1, round(w * resize_max / short)), max(1, round(h * resize_max / short))),
                         Image.Resampling.BICUBIC)
    return Checked(_encode(img, "JPEG", quality=quality), "jpg", img.width, img.height,
                   f"re-encoded as JPEG q{quality}, shorter side <= {resize_max}")


def decode_rgb(data: bytes, *, min_size: tuple[int, int] | None = None) -> Image.Image:
    """Decode encoded bytes to 8-bit RGB by the one rule; with min_size, let JPEGs decode at 1/2-1/8
    scale in the DCT domain as long as the result stays at least that large (much faster)."""
    img = open_image(data)
    if min_size is not None and img.format == "JPEG" and img.mode in PLAIN_MODES:
        img.draft(img.mode, min_size)
    return to_rgb(img)
