"""Apply a plan's pixel ops to a uint8 CHW image on the CPU (the threads, dataloader and prefetch
backends): each op's CPU kernel from the op table (ops.py), AugMix's chains mixed as timm mixes them.
The kernels' shared operations are cpu_kernels.py's."""
from __future__ import annotations

import torch

from .cpu_kernels import Image, blend
from .ops import kind_of


def apply_plan(image: Image, plan, *, fill: tuple[int, int, int] = (0, 0, 0)) -> Image:
    """`image` with a SamplePlan's pixel ops applied: its flat ops, AugMix's chains among them."""
    if plan.augmix is None:
        return apply_ops(image, plan.ops, fill=fill)
    image = apply_ops(image, plan.ops[:plan.augmix_at], fill=fill)
    return apply_ops(augmix(image, plan.augmix, fill), plan.ops[plan.augmix_at:], fill=fill)


def apply_ops(image: Image, ops, *, fill: tuple[int, int, int] = (0, 0, 0)) -> Image:
    """`image` with the ops (kind id, parameter) applied in order; a new tensor when any.
    The affine ops sample bilinearly in every backend (DALI's warps have no cubic mode; timm uses
    the recipe's interpolation there): the one documented difference from timm's pixels."""
    for kind, value in ops:
        image = kind_of(kind).cpu(image, float(value), fill)
    return image


def augmix(image: Image, mix, fill) -> Image:
    """timm's AugMixAugment._apply_basic: each chain on the image, summed by its float32 weight in
    float32, clipped, truncated to uint8 (NumPy's astype), then Image.blend(image, mixed, m)."""
    total = torch.zeros(image.shape, dtype=torch.float32)
    for chain, weight in zip(mix.chains, mix.weights):
        total += weight * apply_ops(image, chain, fill=fill).to(torch.float32)
    mixed = total.clamp_(0, 255).to(torch.uint8)
    return blend(image.to(torch.float32), mixed, mix.m)
