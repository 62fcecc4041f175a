"""Apply a plan's pixel ops inside a DALI graph (the dali backend): each op's DALI kernel from the op
table (ops.py), and the helpers those kernels share, each following the PIL operation cpu.py follows,
on HWC DataNodes.

The source sends each sample's ops row (plan.ops_row: kind id, parameter per slot) and, per slot, the
2 x 3 affine matrix of a geometric op (`slot_matrices`, computed here in Python, identity otherwise).
The graph has one chain of slots; in each, a DALI conditional (a binary split on the kind id, as
DALI's own auto_aug `select`) routes every sample to its kind's applier. Only the kinds and the
number of slots a recipe can produce are built (`op_bounds`): the default recipe builds none.
Conditionals need `@pipeline_def(enable_conditionals=True)`.

Against cpu.py on the same input (tests/backends/test_dali_recipes.py measures it): the point ops,
blends, sharpness, flips and grayscale are exact; the warps differ by rounding;
equalize is PIL's rebuilt from DALI's OpenCV-style equalize, within one level.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .ops import KIND_ID, Matrix, kind_of
from .plan import Op
from .slots import MAX_OPS, OpBounds

INTERP_CODES = {"bilinear": 0, "bicubic": 1}  # what the source sends; the graph maps them to DALI's enum


IDENTITY: Matrix = (1, 0, 0, 0, 1, 0)


def slot_matrices(ops: list[Op] | tuple[Op, ...], size: int) -> np.ndarray:
    """max(MAX_OPS, len(ops)) x 2 x 3 float32: per op slot, its affine matrix on a size x size image
    (identity for a slot without a geometric op)."""
    out = np.empty((max(MAX_OPS, len(ops)), 2, 3), dtype=np.float32)
    out[:] = np.array(IDENTITY, dtype=np.float32).reshape(2, 3)
    for slot, (kind, value) in enumerate(ops):
        affine = kind_of(kind).affine
        if affine is not None:
            out[slot] = np.array(affine(float(value), size, size), dtype=np.float32).reshape(2, 3)
    return out


# ---- the graph side: DALI is imported only from here on, by the functions that build graphs ----

def modules():
    """(nvidia.dali.fn, nvidia.dali.math, nvidia.dali.types), or an ImportError naming the extra."""
    try:
        from nvidia.dali import fn, math as dmath, types
    except ImportError as exc:
        raise ImportError("applying ops in a DALI graph needs NVIDIA DALI: pip install 'datapipe[dali-cu12]' "
                          "(or dali-cu13, the build for torch's CUDA)") from exc
    return fn, dmath, types


@dataclass(frozen=True)
class Context:
    """Build-time facts the appliers need: the fill of uncovered pixels (RGB) and whether the images
    are on the GPU (per-sample parameters then move there for arithmetic with them)."""

    fill: tuple[int, int, int] = (0, 0, 0)
    cuda: bool = False

    def scalar(self, node):
        return node.gpu() if self.cuda else node


def apply_ops(images, row, matrices, layout: OpBounds, context: Context, mix=None):
    """`images` (HWC uint8) with each sample's ops applied in slot order: `row` is the sample's placed
    ops (slots.ops_row), `matrices` their slot_matrices; `mix` (AugMix's chain row, chain matrices,
    weights and blend factor) runs after the first layout.mix_at slots. Out: FLOAT images of whole
    levels 0..255, each op's result rounded as PIL stores it. The ops run on floats, converted once:
    DALI's CPU conversion from float to uint8 costs more than most ops (measured ~1.8 ms per 224 px image)."""
    fn, _, types = modules()
    images = fn.cast(images, dtype=types.FLOAT)
    for slot in range(layout.slots):
        if slot == layout.mix_at and layout.chains:
            images = augmix(images, *mix, layout, context)
        images = _slot(layout, images, row, matrices, slot, context)
    if layout.chains and layout.mix_at == layout.slots:
        images = augmix(images, *mix, layout, context)
    return images


def _slot(layout: OpBounds, images, row, matrices, slot: int, context):
    return _select(layout.kinds, 0, len(layout.kinds) - 1, images, row[2 * slot], row[2 * slot + 1], matrices[slot],
                   context)


def augmix(images, chain_row, chain_matrices, weights, m, layout: OpBounds, context):
    """AugMix as cpu.augmix: each chain's slots on the image, the chains summed by their weights
    (float32), clipped and truncated, then PIL's blend of the image towards that mix by m (truncated)."""
    _, dmath, _ = modules()
    total = None
    for chain in range(layout.chains):
        x = images
        for slot in range(chain * layout.depth, (chain + 1) * layout.depth):
            x = _slot(layout, x, chain_row, chain_matrices, slot, context)
        term = context.scalar(weights[chain]) * x
        total = term if total is None else total + term
    mixed = dmath.floor(dmath.clamp(total, 0.0, 255.0))
    return dmath.floor(images + context.scalar(m) * (mixed - images))


def _select(kinds, lo: int, hi: int, images, kind, value, matrix, context):
    """A binary split of the batch on the kind id (DALI conditionals), down to one applier."""
    if lo == hi:
        return kind_of(KIND_ID[kinds[lo]]).dali(images, value, matrix, context)
    mid = (lo + hi) // 2
    if kind <= KIND_ID[kinds[mid]]:
        out = _select(kinds, lo, mid, images, kind, value, matrix, context)
    else:
        out = _select(kinds, mid + 1, hi, images, kind, value, matrix, context)
    return out


# The helpers the op table's DALI kernels share (float HWC images of whole levels in and out).

def levels(values):
    """Float results -> whole levels as PIL stores a blend: clipped to 0..255, truncated."""
    _, dmath, _ = modules()
    return dmath.clamp(dmath.floor(values), 0.0, 255.0)


def gray(x):
    """PIL's convert("L"), H x W x 1: (R 19595 + G 38470 + B 7471 + 32768) >> 16."""
    fn, dmath, types = modules()
    weights = types.Constant(np.array([19595, 38470, 7471], dtype=np.float32))
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


SMOOTH = np.array([[1, 1, 1], [1, 5, 1], [1, 1, 1]], dtype=np.float32) / 13


def sharpness(x, factor):
    """PIL's SMOOTH filter (rounded), its one-pixel border the original's, blended by the factor."""
    fn, dmath, types = modules()
    smooth = dmath.clamp(dmath.floor(fn.filter(x, SMOOTH, dtype=types.FLOAT) + 0.5), 0.0, 255.0)
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
