"""The CPU kernels' shared operations on uint8 CHW images (torch tensors), each following the PIL
operation timm applies (ImageOps, ImageEnhance, Image.transform): lookup tables for the point ops
(NumPy's uint8 take), blends truncated as PIL's, the affine warp compiled (datapipe._warp: Pillow's
values) with torch's grid_sample as the fallback. The op table (ops.py) calls these from its kernels;
this module imports nothing of the augment package (no import cycle)."""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from .pil_rules import L_WEIGHTS, SMOOTH, SMOOTH_SCALE

try:
    from .. import _warp
except ImportError:  # not built (setup.py's optional extension): torch's grid_sample does the warps
    _warp = None

Image = torch.Tensor  # uint8, 3 x H x W
LEVELS = np.arange(256)


def lut(image: Image, table) -> Image:
    """Map each channel's values through its 256-entry table (3 x 256, or 256 for all), by NumPy's
    uint8-indexed take (several times torch's int64 gather here)."""
    table = np.asarray(table, dtype=np.uint8)
    pixels = image.numpy()
    if table.ndim == 1:
        return torch.from_numpy(np.take(table, pixels))
    return torch.from_numpy(np.stack([np.take(table[c], pixels[c]) for c in range(3)]))


_L_WEIGHTS = torch.tensor(L_WEIGHTS, dtype=torch.float32)


def _gray_float(pixels: torch.Tensor) -> torch.Tensor:
    """PIL's convert("L"), (R 19595 + G 38470 + B 7471 + 32768) >> 16, on float32 pixels 3 x H x W:
    exact, every sum stays below 2^24 and the division is by a power of two."""
    return torch.tensordot(_L_WEIGHTS, pixels, dims=1).add_(32768).div_(65536).floor_()


def _gray(image: Image) -> torch.Tensor:
    return _gray_float(image.to(torch.float32))


def blend(degenerate: torch.Tensor, image: Image, factor: float, pixels: torch.Tensor | None = None) -> Image:
    """PIL's Image.blend(degenerate, image, factor): degenerate + factor (image - degenerate), clipped
    to 0..255 and truncated to uint8 as PIL does. `pixels`: image as float32, if already made."""
    out = image.to(torch.float32) if pixels is None else pixels
    return out.sub_(degenerate).mul_(factor).add_(degenerate).clamp_(0, 255).to(torch.uint8)


def auto_contrast(image: Image) -> Image:
    """PIL's ImageOps.autocontrast (cutoff 0) per channel; its table in float64 with a separate
    multiply and add, as PIL's Python loop computes it (the rounding decides a level where
    i * scale + offset is an integer)."""
    pixels = image.numpy().reshape(3, -1)
    lo, hi = pixels.min(axis=1).astype(np.float64), pixels.max(axis=1).astype(np.float64)
    flat = hi <= lo
    scale = 255.0 / np.where(flat, 1.0, hi - lo)
    table = LEVELS * scale[:, None] + (-lo * scale)[:, None]
    table = np.where(flat[:, None], LEVELS, np.clip(np.trunc(table), 0, 255))
    return lut(image, table)


def equalize(image: Image) -> Image:
    """PIL's ImageOps.equalize, per channel: step = (pixels - the last used level's count) // 255,
    level i -> (step // 2 + pixels below i) // step."""
    tables = []
    for channel in image.numpy():
        hist = np.bincount(channel.reshape(-1), minlength=256)
        used = hist[hist > 0]
        step = int((used.sum() - used[-1]) // 255) if len(used) > 1 else 0
        if step == 0:
            tables.append(LEVELS)
            continue
        below = np.cumsum(hist) - hist
        tables.append(np.minimum((below + step // 2) // step, 255))
    return lut(image, np.stack(tables))


def solarize(image: Image, threshold: float) -> Image:
    """Values >= the threshold inverted (a threshold above 255, timm's level 0, inverts nothing)."""
    return lut(image, np.where(LEVELS >= threshold, 255 - LEVELS, LEVELS))


def solarize_add(image: Image, value: float) -> Image:
    """int(value) added to values below 128, saturating."""
    return lut(image, np.where(LEVELS < 128, np.minimum(255, LEVELS + int(value)), LEVELS))


def posterize(image: Image, bits: float) -> Image:
    bits = int(bits)
    return image if bits >= 8 else image & (~(2 ** (8 - bits) - 1) & 0xFF)


def color(image: Image, value: float) -> Image:
    pixels = image.to(torch.float32)
    return blend(_gray_float(pixels)[None], image, value, pixels)


def contrast(image: Image, value: float) -> Image:
    """ImageEnhance.Contrast: blend with the L image's mean, int(mean + 0.5)."""
    pixels = image.to(torch.float32)
    mean = int(_gray_float(pixels).to(torch.float64).mean().item() + 0.5)
    return blend(torch.tensor(float(mean)), image, value, pixels)


def brightness(image: Image, value: float) -> Image:
    return image.to(torch.float32).mul_(value).clamp_(0, 255).to(torch.uint8)


def sharpness(image: Image, value: float) -> Image:
    """PIL's ImageFilter.SMOOTH (3 x 3 of ones, centre 5, / 13, rounded), its one-pixel border the
    original's: the 3 x 3 sum (a box filter, by shifted adds) plus 4 x the centre."""
    pixels = image.to(torch.float32)
    rows = pixels[:, :-2] + pixels[:, 1:-1]
    rows += pixels[:, 2:]
    box = rows[:, :, :-2] + rows[:, :, 1:-1]
    box += rows[:, :, 2:]
    smooth = pixels.clone()
    centre = SMOOTH[1][1] - 1  # the box sum holds the centre once already
    smooth[:, 1:-1, 1:-1] = box.add_(pixels[:, 1:-1, 1:-1], alpha=centre).div_(SMOOTH_SCALE).add_(0.5).floor_()
    return blend(smooth, image, value, pixels)


def grayscale(image: Image) -> Image:
    return _gray(image).to(torch.uint8)[None].expand(3, -1, -1).contiguous()


def hue(image: Image, shift: int) -> Image:
    """torchvision's adjust_hue on a PIL image: PIL's HSV (8 bits a channel), the hue channel shifted by
    `shift` with wrap-around, back to RGB. Pillow's own conversions: the reference, exactly."""
    from PIL import Image as PILImage

    hsv = np.array(PILImage.fromarray(np.ascontiguousarray(image.permute(1, 2, 0).numpy())).convert("HSV"))
    hsv[..., 0] += np.uint8(shift % 256)
    rgb = np.array(PILImage.fromarray(hsv, "HSV").convert("RGB"))
    return torch.from_numpy(rgb).permute(2, 0, 1).contiguous()


def affine(image: Image, matrix: tuple[float, ...], fill) -> Image:
    """PIL's Image.transform(AFFINE, (a, b, c, d, e, f)): the output pixel centred at (x, y) takes the
    input at (a x + b y + c, d x + e y + f); pixels from outside the image get `fill`. The compiled
    warp (datapipe._warp: Pillow's values exactly, one pass on the uint8 pixels, the GIL released)
    where it was built, else torch's grid_sample (the same rule in float32: a level apart at the edges
    of truncation, a border pixel sampled where Pillow fills)."""
    if _warp is not None:
        image = image.contiguous()
        out = torch.empty_like(image)
        _warp.warp_affine(image.numpy(), out.numpy(), image.shape[2], image.shape[1],
                          tuple(float(v) for v in matrix), tuple(int(v) for v in fill))
        return out
    return affine_grid_sample(image, matrix, fill)


def affine_grid_sample(image: Image, matrix: tuple[float, ...], fill) -> Image:
    """affine() by torch's affine_grid and grid_sample (bilinear, border-clamped, float32, truncated)."""
    _, h, w = image.shape
    a, b, c, d, e, f = matrix
    # the same map in grid_sample's coordinates (-1..1 over the pixels' outer edges, align_corners=False)
    theta = torch.tensor([[a, b * h / w, a + b * h / w + 2 * c / w - 1],
                          [d * w / h, e, d * w / h + e + 2 * f / h - 1]], dtype=torch.float32)
    grid = F.affine_grid(theta[None], [1, 3, h, w], align_corners=False)
    out = F.grid_sample(image.to(torch.float32)[None], grid, mode="bilinear", padding_mode="border",
                        align_corners=False)[0]
    inside = ((grid >= -1) & (grid < 1)).all(-1)  # PIL fills a pixel whose centre maps outside [0, size)
    colour = torch.tensor(fill, dtype=torch.float32).view(3, 1, 1)
    return torch.where(inside, out, colour).clamp_(0, 255).to(torch.uint8)
