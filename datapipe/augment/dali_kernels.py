"""The DALI kernels' shared operations on float HWC DataNodes of whole levels 0..255, each following
the PIL operation augment.cpu_kernels follows. The op table (ops.py) calls these from its kernels; this
module imports nothing of the augment package (no import cycle), and DALI only inside its functions."""
from __future__ import annotations

import os

import numpy as np

from .pil_rules import L_WEIGHTS, SMOOTH, SMOOTH_SCALE


def without_cse() -> None:
    """Turn DALI's common-subexpression elimination off for this process (unless the user set
    DALI_ENABLE_CSE): on DALI 2.4's GPU operators it breaks the op slots' conditionals. Two kinds
    whose kernels share a subexpression (color and contrast: a blend with the same per-sample factor)
    fail at build with "Graph inconsistency detected - the OpSpec's input 1 "__Split_N[1]" not found";
    with CSE off all 19 kinds build and match the CPU applier (benchmarks/gpu-h100-session18). DALI
    reads the switch from the environment when a pipeline is built; augment.dali calls this once, at
    its import. Never from code a graph function calls: DALI's AutoGraph traces that code, and its
    warning about `os.environ.setdefault` printed the whole environment, credentials included."""
    os.environ.setdefault("DALI_ENABLE_CSE", "0")


def modules():
    """(nvidia.dali.fn, nvidia.dali.math, nvidia.dali.types), or an ImportError naming the extra. Called
    inside graph functions (AutoGraph traces it): it imports, and touches no environment."""
    try:
        from nvidia.dali import fn, math as dmath, types
    except ImportError as exc:
        raise ImportError("applying ops in a DALI graph needs NVIDIA DALI: pip install 'datapipe[dali-cu12]' "
                          "(or dali-cu13, the build for torch's CUDA)") from exc
    return fn, dmath, types


def levels(values):
    """Float results -> whole levels as PIL stores a blend: clipped to 0..255, truncated."""
    _, dmath, _ = modules()
    return dmath.clamp(dmath.floor(values), 0.0, 255.0)


def gray(x):
    """PIL's convert("L"), H x W x 1: (R 19595 + G 38470 + B 7471 + 32768) >> 16."""
    fn, dmath, types = modules()
    weights = types.Constant(np.array(L_WEIGHTS, dtype=np.float32))
    total = fn.reductions.sum(x * weights, axes=[2], keep_dims=True)
    return dmath.floor((total + 32768.0) / 65536.0)


def blend(degenerate, x, factor):
    """PIL's Image.blend(degenerate, image, factor)."""
    return levels(degenerate + factor * (x - degenerate))


def auto_contrast(x):
    """PIL's ImageOps.autocontrast per channel: min..max stretched to 0..255 (flat channels kept)."""
    fn, dmath, _ = modules()
    lo = fn.reductions.min(x, axes=[0, 1], keep_dims=True)
    hi = fn.reductions.max(x, axes=[0, 1], keep_dims=True)
    spread = hi > lo
    scale = 1.0 + spread * (255.0 / dmath.max(hi - lo, 1.0) - 1.0)  # 1 where the channel is flat
    return levels(x * scale + spread * (-lo * scale))


def equalize(x):
    """PIL's ImageOps.equalize per channel, from DALI's (OpenCV's) equalize: of the inverted image,
    inverted back, it is round(255 C / D), C the channel's pixels below a value and D those below
    its maximum; PIL's is round(C / s) with the integer step s = D // 255, so the values are scaled
    by D / (255 s) (PIL: no change where s is 0). Within one level of PIL's (measured)."""
    fn, dmath, types = modules()
    top = fn.reductions.max(x, axes=[0, 1], keep_dims=True)
    below_top = fn.reductions.sum(fn.cast(x < top, dtype=types.FLOAT), axes=[0, 1], keep_dims=True)  # D
    step = dmath.floor(below_top / 255.0)
    inverted = fn.cast(255.0 - x, dtype=types.UINT8)
    levels = 255.0 - fn.cast(fn.equalize(inverted), dtype=types.FLOAT)
    scaled = dmath.floor(levels * below_top / (255.0 * dmath.max(step, 1.0)) + 0.5)
    return x + (step > 0.5) * (dmath.min(scaled, 255.0) - x)


def gray_mean(x):
    """ImageEnhance.Contrast's degenerate: the L image's mean, int(mean + 0.5)."""
    fn, dmath, _ = modules()
    return dmath.floor(fn.reductions.mean(gray(x)) + 0.5)


def sharpness(x, factor):
    """PIL's SMOOTH filter (rounded), its one-pixel border the original's, blended by the factor."""
    fn, dmath, types = modules()
    smooth = dmath.clamp(dmath.floor(fn.filter(x, np.array(SMOOTH, dtype=np.float32) / SMOOTH_SCALE, dtype=types.FLOAT) + 0.5), 0.0, 255.0)
    ones = x[:, :, 0:1] * 0.0 + 1.0
    inner = fn.filter(ones, np.ones((3, 3), np.float32), border="constant", dtype=types.FLOAT) > 8.5
    return blend(x + inner * (smooth - x), x, factor)


def grayscale(x):
    fn, _, _ = modules()
    level = gray(x)
    return fn.cat(level, level, level, axis=2)


def hue(x, shift):
    """adjust_hue as cpu.hue does it, in arithmetic: PIL's RGB -> HSV (hue and saturation truncated to
    8 bits), the hue shifted with wrap-around, PIL's HSV -> RGB (rounded); float32 where PIL mixes
    float and double, so a hue byte may differ at a rounding edge (measured in the tests)."""
    fn, dmath, _ = modules()
    r, g, b = x[:, :, 0:1], x[:, :, 1:2], x[:, :, 2:3]
    top, low = dmath.max(r, dmath.max(g, b)), dmath.min(r, dmath.min(g, b))
    spread = dmath.max(top - low, 1.0)
    rc, gc, bc = (top - r) / spread, (top - g) / spread, (top - b) / spread
    red_top = r >= top
    green_top = (g >= top) * (1.0 - red_top)
    h = red_top * (bc - gc) + green_top * (2.0 + rc - bc) + (1.0 - red_top - green_top) * (4.0 + gc - rc)
    h = h / 6.0 + 1.0
    colour = top > low
    h_byte = colour * dmath.clamp(dmath.floor((h - dmath.floor(h)) * 255.0), 0.0, 255.0)
    s_byte = colour * dmath.clamp(dmath.floor((top - low) / dmath.max(top, 1.0) * 255.0), 0.0, 255.0)
    h_byte = h_byte + shift
    h_byte = h_byte - 256.0 * (h_byte >= 256.0)
    sector = dmath.floor(h_byte * 6.0 / 255.0)
    f, fs = h_byte * 6.0 / 255.0 - sector, s_byte / 255.0
    p = dmath.floor(top * (1.0 - fs) + 0.5)
    q = dmath.floor(top * (1.0 - fs * f) + 0.5)
    t = dmath.floor(top * (1.0 - fs * (1.0 - f)) + 0.5)
    sector = sector - 6.0 * (sector >= 6.0)
    cases = [sector == float(k) for k in range(6)]

    def pick(*values):
        return sum(case * value for case, value in zip(cases, values))
    grey = s_byte < 0.5
    channels = [top + (1.0 - grey) * (pick(*row) - top) for row in ((top, q, p, p, t, top), (t, top, top, q, p, p),
                                                                   (p, p, t, top, top, q))]
    return fn.cat(*channels, axis=2)


def affine(x, matrix, context):
    """PIL's Image.transform(AFFINE) as cpu.affine has it: bilinear samples, border pixels repeated,
    and the fill colour where a pixel's centre maps outside the image. DALI's fill_value is one
    scalar, so "outside" is a channel of ones warped with nearest-neighbour sampling and 0 outside."""
    fn, dmath, types = modules()
    warped = fn.warp_affine(x, matrix=matrix, interp_type=types.INTERP_LINEAR)  # no fill_value: clamped
    inside = fn.warp_affine(x[:, :, 0:1] * 0.0 + 1.0, matrix=matrix, fill_value=0.0, interp_type=types.INTERP_NN)
    fill = types.Constant(np.array(context.fill, dtype=np.float32))
    return dmath.clamp(dmath.floor(fill + (inside > 0.5) * (warped - fill)), 0.0, 255.0)
