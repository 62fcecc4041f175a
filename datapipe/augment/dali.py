"""Apply a plan's pixel ops inside a DALI graph (the dali backend): each op's DALI kernel from the op
table (ops.py; their shared operations in dali_kernels.py), on HWC DataNodes.

The source sends each sample's placed ops (slots.placed_ops, as slots.ops_row: kind id, parameter per
slot) and, per slot, the 2 x 3 affine matrix of a geometric op (`slot_matrices`, computed in Python,
identity otherwise); with AugMix, its chains placed the same way, their weights and blend factor. The
graph has one sequence of slots (AugMix's chains x depth slots and their weighted mix after the first
bounds.augmix_at of them); in each slot, a DALI conditional (a binary split on the kind id, as DALI's own
auto_aug `select`) routes every sample to its kind's kernel. Only the kinds and slots a recipe can
produce are built (slots.op_bounds): the default recipe builds none. Conditionals need
`@pipeline_def(enable_conditionals=True)`.

Against cpu.py on the same input (selftest/recipe_ops.py's tolerances, measured by the tests and by
`datapipe doctor --gpu` on a GPU): the point ops, blends, sharpness, flips, grayscale and translations
are exact; rotations and shears differ by float rounding; equalize is PIL's rebuilt from DALI's
OpenCV-style equalize, within one level.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .dali_kernels import modules, without_cse
from .ops import KIND_ID, Matrix, kind_of
from .plan import Op
from .slots import MAX_OPS, OpBounds

# DALI's CSE off, once, before any graph of these ops is built (the dali backend's graph and the selftest
# import this module first). Here, not in a function a graph calls: AutoGraph traces those, and its
# warning about os.environ.setdefault printed the whole environment (credentials included) on stderr.
without_cse()
INTERP_CODES = {"bilinear": 0, "bicubic": 1}  # what the source sends; the graph maps them to DALI's enum


IDENTITY_MATRIX: Matrix = (1, 0, 0, 0, 1, 0)


def slot_matrices(ops: list[Op] | tuple[Op, ...], size: int) -> np.ndarray:
    """max(MAX_OPS, len(ops)) x 2 x 3 float32: per op slot, its affine matrix on a size x size image
    (identity for a slot without a geometric op)."""
    out = np.empty((max(MAX_OPS, len(ops)), 2, 3), dtype=np.float32)
    out[:] = np.array(IDENTITY_MATRIX, dtype=np.float32).reshape(2, 3)
    for slot, (kind, value) in enumerate(ops):
        affine = kind_of(kind).affine
        if affine is not None:
            out[slot] = np.array(affine(float(value), size, size), dtype=np.float32).reshape(2, 3)
    return out


# ---- the graph side: DALI is imported only by the functions that build graphs ----

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
    weights and blend factor) runs after the first layout.augmix_at slots. Out: FLOAT images of whole
    levels 0..255, each op's result rounded as PIL stores it. The ops run on floats, converted once:
    DALI's CPU conversion from float to uint8 costs more than most ops (measured ~1.8 ms per 224 px image)."""
    fn, _, types = modules()
    images = fn.cast(images, dtype=types.FLOAT)
    for slot in range(layout.slots):
        if slot == layout.augmix_at and layout.chains:
            images = augmix(images, *mix, layout, context)
        images = _slot(layout, images, row, matrices, slot, context)
    if layout.chains and layout.augmix_at == layout.slots:
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
