"""Apply a plan's pixel ops inside a DALI graph (the dali backend): one applier per kind of
datapipe.augment.ops.KINDS, each following the PIL operation cpu.py follows, on HWC uint8 DataNodes.

The source sends each sample's ops row (plan.ops_row: kind id, parameter per slot) and, per slot, the
2 x 3 affine matrix of a geometric op (`slot_matrices`, computed here in Python, identity otherwise).
The graph has one chain of slots; in each, a DALI conditional (a binary split on the kind id, as
DALI's own auto_aug `select`) routes every sample to its kind's applier. Only the kinds and the
number of slots a recipe can produce are built (`op_layout`): the default recipe builds none.
Conditionals need `@pipeline_def(enable_conditionals=True)`.

Against cpu.py on the same input (tests/backends/test_dali_recipes.py measures it): the point ops,
blends, sharpness, flips and grayscale are exact; the warps differ by rounding;
equalize is PIL's rebuilt from DALI's OpenCV-style equalize, within one level.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .ops import AFFINE, KIND_ID, KINDS, Matrix, POLICIES, RAND_INCREASING_OPS, RAND_OPS, TIMM_OPS, TRIVIAL_OPS
from .plan import MAX_OPS, Op
from .recipe import Recipe

INTERP_CODES = {"bilinear": 0, "bicubic": 1}  # what the source sends; the graph maps them to DALI's enum


IDENTITY: Matrix = (1, 0, 0, 0, 1, 0)


def slot_matrices(ops: tuple[Op, ...], size: int) -> np.ndarray:
    """MAX_OPS x 2 x 3 float32: per op slot, its affine matrix on a size x size image (identity for
    a slot without a geometric op)."""
    out = np.empty((MAX_OPS, 2, 3), dtype=np.float32)
    out[:] = np.array(IDENTITY, dtype=np.float32).reshape(2, 3)
    for slot, (kind, value) in enumerate(ops):
        affine = AFFINE.get(KINDS[int(kind)])
        if affine is not None:
            out[slot] = np.array(affine(float(value), size, size), dtype=np.float32).reshape(2, 3)
    return out


@dataclass(frozen=True)
class OpLayout:
    """What a recipe's plans can hold: `slots` op slots at most, of `kinds` (names, identity first)."""

    slots: int
    kinds: tuple[str, ...]


def op_layout(recipe: Recipe | None) -> OpLayout:
    """The op slots and kinds the planner can draw for `recipe` (plan.plan_sample's draw order): vflip,
    the auto-augment ops, the jitter's factors, grayscale. None or the default recipe: no slot."""
    if recipe is None:
        return OpLayout(0, ("identity",))
    slots, kinds = 0, {"identity"}
    if recipe.vflip > 0:
        slots, kinds = slots + 1, kinds | {"vflip"}
    augment = recipe.augment
    if augment is not None:
        if augment.policy == "rand":
            names = RAND_INCREASING_OPS if augment.increasing else RAND_OPS
            slots += augment.num_ops
            kinds |= {TIMM_OPS[name].kind for name in names}
        elif augment.policy == "trivialaugment":
            slots += 1
            kinds |= {kind for kind, *_ in TRIVIAL_OPS}
        else:
            policy = POLICIES[augment.policy]
            slots += max(len(sub) for sub in policy)
            kinds |= {TIMM_OPS[name].kind for sub in policy for name, *_ in sub}
    if recipe.jitter is not None:
        drawn = [kind for kind, strength in zip(("brightness", "contrast", "color"), recipe.jitter) if strength > 0]
        slots, kinds = slots + len(drawn), kinds | set(drawn)
    if recipe.grayscale_prob > 0:
        slots, kinds = slots + 1, kinds | {"grayscale"}
    return OpLayout(min(slots, MAX_OPS), tuple(sorted(kinds, key=KIND_ID.__getitem__)))


# ---- the graph side: DALI is imported only from here on, by the functions that build graphs ----

def _dali():
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


def apply_ops(images, row, matrices, layout: OpLayout, context: Context):
    """`images` (HWC uint8) with each sample's ops applied in slot order: `row` is the sample's
    plan.ops_row, `matrices` its slot_matrices. Out: FLOAT images of whole levels 0..255, each op's
    result rounded as PIL stores it. The ops run on floats, converted once: DALI's CPU conversion
    from float to uint8 costs more than most ops (measured ~1.8 ms per 224 px image)."""
    fn, _, types = _dali()
    images = fn.cast(images, dtype=types.FLOAT)
    for slot in range(layout.slots):
        images = _select(layout.kinds, 0, len(layout.kinds) - 1, images, row[2 * slot], row[2 * slot + 1],
                         matrices[slot], context)
    return images


def _select(kinds, lo: int, hi: int, images, kind, value, matrix, context):
    """A binary split of the batch on the kind id (DALI conditionals), down to one applier."""
    if lo == hi:
        return APPLIERS[kinds[lo]](images, value, matrix, context)
    mid = (lo + hi) // 2
    if kind <= KIND_ID[kinds[mid]]:
        out = _select(kinds, lo, mid, images, kind, value, matrix, context)
    else:
        out = _select(kinds, mid + 1, hi, images, kind, value, matrix, context)
    return out


# The appliers: (float HWC images of whole levels, the parameter, the slot's matrix, Context) -> the same.

def _levels(values):
    """Float results -> whole levels as PIL stores a blend: clipped to 0..255, truncated."""
    _, dmath, _ = _dali()
    return dmath.clamp(dmath.floor(values), 0.0, 255.0)


def _gray(x):
    """PIL's convert("L"), H x W x 1: (R 19595 + G 38470 + B 7471 + 32768) >> 16."""
    fn, dmath, types = _dali()
    weights = types.Constant(np.array([19595, 38470, 7471], dtype=np.float32))
    total = fn.reductions.sum(x * weights, axes=[2], keep_dims=True)
    return dmath.floor((total + 32768.0) / 65536.0)


def _blend(degenerate, x, factor):
    """PIL's Image.blend(degenerate, image, factor)."""
    return _levels(degenerate + factor * (x - degenerate))


def identity(x, value, matrix, context):
    return x


def auto_contrast(x, value, matrix, context):
    """PIL's ImageOps.autocontrast per channel: min..max stretched to 0..255 (flat channels kept)."""
    fn, dmath, _ = _dali()
    lo = fn.reductions.min(x, axes=[0, 1], keep_dims=True)
    hi = fn.reductions.max(x, axes=[0, 1], keep_dims=True)
    spread = hi > lo
    scale = 1.0 + spread * (255.0 / dmath.max(hi - lo, 1.0) - 1.0)  # 1 where the channel is flat
    return _levels(x * scale + spread * (-lo * scale))


def equalize(x, value, matrix, context):
    """PIL's ImageOps.equalize per channel, from DALI's (OpenCV's) equalize: of the inverted image,
    inverted back, it is round(255 C / D), C the channel's pixels below a value and D those below
    its maximum; PIL's is round(C / s) with the integer step s = D // 255, so the values are scaled
    by D / (255 s) (PIL: no change where s is 0). Within one level of PIL's (measured)."""
    fn, dmath, types = _dali()
    top = fn.reductions.max(x, axes=[0, 1], keep_dims=True)
    below_top = fn.reductions.sum(fn.cast(x < top, dtype=types.FLOAT), axes=[0, 1], keep_dims=True)  # D
    step = dmath.floor(below_top / 255.0)
    inverted = fn.cast(255.0 - x, dtype=types.UINT8)
    levels = 255.0 - fn.cast(fn.equalize(inverted), dtype=types.FLOAT)
    scaled = dmath.floor(levels * below_top / (255.0 * dmath.max(step, 1.0)) + 0.5)
    return x + (step > 0.5) * (dmath.min(scaled, 255.0) - x)


def invert(x, value, matrix, context):
    return 255.0 - x


def posterize(x, value, matrix, context):
    """The `value` high bits kept (0: black): levels rounded down to a multiple of 2 ** (8 - bits)."""
    _, dmath, _ = _dali()
    step = dmath.pow(2.0, 8.0 - dmath.clamp(dmath.floor(context.scalar(value)), 0.0, 8.0))
    return dmath.floor(x / step) * step


def solarize(x, value, matrix, context):
    return x + (x >= context.scalar(value)) * (255.0 - 2.0 * x)


def solarize_add(x, value, matrix, context):
    _, dmath, _ = _dali()
    added = dmath.clamp(x + dmath.floor(context.scalar(value)), 0.0, 255.0)
    return x + (x < 128.0) * (added - x)


def color(x, value, matrix, context):
    return _blend(_gray(x), x, context.scalar(value))


def contrast(x, value, matrix, context):
    fn, dmath, _ = _dali()
    mean = dmath.floor(fn.reductions.mean(_gray(x)) + 0.5)
    return _blend(mean, x, context.scalar(value))


def brightness(x, value, matrix, context):
    return _levels(context.scalar(value) * x)


SMOOTH = np.array([[1, 1, 1], [1, 5, 1], [1, 1, 1]], dtype=np.float32) / 13


def sharpness(x, value, matrix, context):
    """PIL's SMOOTH filter (rounded), its one-pixel border the original's, blended by the factor."""
    fn, dmath, types = _dali()
    smooth = dmath.clamp(dmath.floor(fn.filter(x, SMOOTH, dtype=types.FLOAT) + 0.5), 0.0, 255.0)
    ones = x[:, :, 0:1] * 0.0 + 1.0
    inner = fn.filter(ones, np.ones((3, 3), np.float32), border="constant", dtype=types.FLOAT) > 8.5
    return _blend(x + inner * (smooth - x), x, context.scalar(value))


def vflip(x, value, matrix, context):
    fn, _, _ = _dali()
    return fn.flip(x, horizontal=0, vertical=1)


def grayscale(x, value, matrix, context):
    fn, _, _ = _dali()
    gray = _gray(x)
    return fn.cat(gray, gray, gray, axis=2)


def _affine(x, value, matrix, context):
    """PIL's Image.transform(AFFINE) as cpu._affine has it: bilinear samples, border pixels repeated,
    and the fill colour where a pixel's centre maps outside the image. DALI's fill_value is one
    scalar, so "outside" is a channel of ones warped with nearest-neighbour sampling and 0 outside."""
    fn, dmath, types = _dali()
    warped = fn.warp_affine(x, matrix=matrix, interp_type=types.INTERP_LINEAR)  # no fill_value: clamped
    inside = fn.warp_affine(x[:, :, 0:1] * 0.0 + 1.0, matrix=matrix, fill_value=0.0, interp_type=types.INTERP_NN)
    fill = types.Constant(np.array(context.fill, dtype=np.float32))
    return dmath.clamp(dmath.floor(fill + (inside > 0.5) * (warped - fill) + 0.5), 0.0, 255.0)


rotate = shear_x = shear_y = translate_x = translate_y = _affine

APPLIERS: dict[str, Callable] = {name: globals()[name] for name in KINDS}
