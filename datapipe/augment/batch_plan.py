"""The batch stage's draws (datapipe.augment.batch applies them on the output device): random erasing
per record, keyed like its view (seed, epoch, record key) on a stream of its own, and mixup / cutmix
per batch, keyed by (seed, epoch, the batch's position in the epoch, rank). Pure functions, so a
resumed epoch, at any world size, draws the uninterrupted run's boxes and lams."""
from __future__ import annotations

import math
import random
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from .plan import stream_seed
from .recipe import Recipe

Box = tuple[int, int, int, int]  # top, left, height, width


def plan_erase(recipe: Recipe, seed: int, epoch: int, index: int, size: int) -> tuple[tuple[Box, ...], int]:
    """timm's RandomErasing on a size x size view (probability, 1..re_count boxes of 2%..1/3 of the area
    over their count, log-uniform aspect 0.3..3.3, 10 tries each): the boxes, and the seed of the noise
    that fills them in 'rand' and 'pixel' modes. A stream of its own, keyed like the view's."""
    rng = random.Random(random.Random(stream_seed(seed, epoch, index)).getrandbits(64) ^ 0x5EED_E7A5E)
    if recipe.re_prob <= 0 or rng.random() > recipe.re_prob:
        return (), 0
    boxes = []
    count = rng.randint(1, recipe.re_count) if recipe.re_count > 1 else 1  # timm: randint(min_count, max_count)
    area = size * size
    log_ratio = (math.log(0.3), math.log(1 / 0.3))
    for _ in range(count):
        for _ in range(10):
            target = rng.uniform(0.02, 1 / 3) * area / count
            aspect = math.exp(rng.uniform(*log_ratio))
            h, w = int(round(math.sqrt(target * aspect))), int(round(math.sqrt(target / aspect)))
            if w < size and h < size:
                boxes.append((rng.randint(0, size - h), rng.randint(0, size - w), h, w))
                break
    return tuple(boxes), rng.getrandbits(63)


def erase_noise(noise_seed: int, shapes: list[tuple[int, ...]]) -> list[np.ndarray]:
    """The normal float32 noise of a record's erased boxes ('rand': 3 x 1 x 1, 'pixel': 3 x h x w
    each), in their plan's order from one stream keyed by the record's noise seed (plan_erase)."""
    rng = np.random.default_rng(noise_seed)
    return [rng.standard_normal(shape, dtype=np.float32) for shape in shapes]


def position_key(position: Any) -> int:
    """A stable integer for a plan position (an int, or the shard-wise plan's segments)."""
    if isinstance(position, int):
        return position
    return zlib.crc32(repr(position).encode())


@dataclass(frozen=True)
class MixupPlan:
    """A batch's mixing: per sample its lam (1: unmixed) and, for cutmix, the box (top, bottom, left,
    right) taken from its partner N-1-i; in batch mode every sample has the same."""

    lams: np.ndarray
    boxes: tuple[tuple[int, int, int, int] | None, ...]


def plan_mix(recipe: Recipe, seed: int, epoch: int, position: Any, rank: int, count: int, height: int,
             width: int) -> MixupPlan:
    """timm's Mixup draws for a batch of `count` height x width images: batch mode (_params_per_batch,
    one lam, cutmix with switch_prob) or elem mode (_params_per_elem); cutmix boxes by rand_bbox with
    the lam corrected to the box's area."""
    rng = np.random.default_rng([seed, epoch, position_key(position), rank, 0x4D4958])
    draws = 1 if recipe.mix_mode == "batch" else count
    use_cutmix = np.zeros(draws, dtype=bool)
    if recipe.mixup_alpha > 0 and recipe.cutmix_alpha > 0:
        use_cutmix = rng.random(draws) < recipe.switch_prob
        lam = np.where(use_cutmix, rng.beta(recipe.cutmix_alpha, recipe.cutmix_alpha, draws),
                       rng.beta(recipe.mixup_alpha, recipe.mixup_alpha, draws))
    elif recipe.mixup_alpha > 0:
        lam = rng.beta(recipe.mixup_alpha, recipe.mixup_alpha, draws)
    else:
        use_cutmix[:] = True
        lam = rng.beta(recipe.cutmix_alpha, recipe.cutmix_alpha, draws)
    mixed = rng.random(draws) < recipe.mixup_prob
    lams, cut = np.where(mixed, lam, 1.0).astype(np.float32), use_cutmix & mixed
    boxes: list[tuple[int, int, int, int] | None] = [None] * draws
    for i in range(draws):
        if cut[i] and lams[i] != 1.0:
            *box, lams[i] = _cut_box(rng, float(lams[i]), height, width)
            boxes[i] = tuple(box)  # type: ignore[assignment]
    if draws == 1:
        return MixupPlan(np.full(count, lams[0], dtype=np.float32), tuple(boxes * count))
    return MixupPlan(lams, tuple(boxes))


def _cut_box(rng: np.random.Generator, lam: float, h: int, w: int) -> tuple[int, int, int, int, float]:
    """timm's rand_bbox + lam correction: (top, bottom, left, right, the lam of the area kept)."""
    ratio = np.sqrt(1 - lam)
    cut_h, cut_w = int(h * ratio), int(w * ratio)
    cy, cx = int(rng.integers(0, h)), int(rng.integers(0, w))
    top, bottom = int(np.clip(cy - cut_h // 2, 0, h)), int(np.clip(cy + (cut_h + 1) // 2, 0, h))  # timm 1.0.31
    left, right = int(np.clip(cx - cut_w // 2, 0, w)), int(np.clip(cx + (cut_w + 1) // 2, 0, w))
    return top, bottom, left, right, 1.0 - (bottom - top) * (right - left) / float(h * w)
