"""The planner: every random choice of one record in one epoch, drawn in one place.

(recipe, seed, epoch, record, image size, width, height) -> a SamplePlan: the crop box, flip and
interpolation (datapipe.geometry.plan_view), then the pixel ops in the order they apply (vertical
flip, the auto-augment ops with their final parameters, the colour jitter in its drawn order,
grayscale). Erasing boxes are planned apart (plan_erase): they depend on the output size only, so
the batch stage plans them from a batch's record indices. Every backend applies these plans, so a
record gets the same augmentation whichever backend serves it; no backend draws its own numbers.

Mixup and cutmix are planned per batch (plan_mix): a lam and box per sample, keyed by (seed, epoch,
the batch's position in the epoch, rank). Pure (random.Random streams keyed by (seed, epoch, record);
NumPy's generator for the mixing's Beta draws), so DALI's source workers and the CPU backends share it. Draw order (fixed, so the default recipe's crops equal the
loader's historical ones): crop, hflip, [interpolation], [vflip], auto-augment, [jitter], [grayscale].
"""
from __future__ import annotations

import math
import random
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..geometry import Crop, plan_view, sample_rng
from .ops import ENHANCE, KIND_ID, POLICIES, RAND_INCREASING_OPS, RAND_OPS, TIMM_OPS, TRIVIAL_BINS, TRIVIAL_MAGNITUDES, TRIVIAL_OPS
from .recipe import AutoAugment, Recipe

MAX_OPS = 8  # op slots of a plan row: vflip + up to 4 auto-augment ops + 3 jitter + grayscale
Op = tuple[int, float]  # (kind id, parameter)


@dataclass(frozen=True)
class SamplePlan:
    """A record's whole augmentation: view (crop None for the eval view), interpolation, pixel ops."""

    crop: Crop | None
    interpolation: str
    ops: tuple[Op, ...]

    def row(self) -> list[float]:
        return ops_row(self.ops)


def plan_sample(recipe: Recipe | None, seed: int, epoch: int, index: int, size: int, width: int, height: int,
                *, train: bool = True) -> SamplePlan:
    """The plan of record `index` (a width x height upright image) in `epoch`, at output `size`."""
    rng = sample_rng(seed, epoch, index)
    crop, interpolation = plan_view(recipe, width, height, size, train=train, rng=rng)
    return SamplePlan(crop, interpolation, plan_ops(recipe, size, rng) if train else ())


def plan_ops(recipe: Recipe | None, size: int, rng: random.Random) -> tuple[Op, ...]:
    """The pixel ops after the view, drawn from `rng` right after plan_view's draws."""
    if recipe is None:
        return ()
    ops: list[Op] = []
    if recipe.vflip > 0 and rng.random() < recipe.vflip:
        ops.append((KIND_ID["vflip"], 0.0))
    augment = recipe.augment
    if augment is not None:
        ops.extend(_auto_augment(augment, size, rng))
    if recipe.jitter is not None:
        ops.extend(_jitter(recipe.jitter, rng))
    if recipe.grayscale_prob > 0 and rng.random() < recipe.grayscale_prob:
        ops.append((KIND_ID["grayscale"], 0.0))
    if len(ops) > MAX_OPS:
        raise ValueError(f"a plan holds at most {MAX_OPS} ops, this recipe drew {len(ops)}: use n <= 4 in auto_augment")
    return tuple(ops)


def _timm_op(name: str, prob: float, magnitude: float, augment: AutoAugment, size: int,
             rng: random.Random) -> Op | None:
    """timm's AugmentOp.__call__: skipped with 1 - prob, magnitude noise, clip, level -> parameter."""
    if prob < 1.0 and rng.random() > prob:
        return None
    if augment.magnitude_std == math.inf:
        magnitude = rng.uniform(0, magnitude)
    elif augment.magnitude_std > 0:
        magnitude = rng.gauss(magnitude, augment.magnitude_std)
    magnitude = max(0.0, min(magnitude, augment.magnitude_max))
    spec = TIMM_OPS[name]
    value = spec.level(magnitude, size) if spec.level else 0.0
    if spec.negate and rng.random() > 0.5:
        value = -value
    if spec.finish:
        value = spec.finish(value)
    return KIND_ID[spec.kind], float(value)


def _auto_augment(augment: AutoAugment, size: int, rng: random.Random) -> list[Op]:
    drawn: list[Op | None]
    if augment.policy == "rand":
        names = RAND_INCREASING_OPS if augment.increasing else RAND_OPS
        chosen = [names[rng.randrange(len(names))] for _ in range(augment.num_ops)]  # with replacement, as timm
        drawn = [_timm_op(name, 0.5, augment.magnitude, augment, size, rng) for name in chosen]
    elif augment.policy == "trivialaugment":
        drawn = [_trivial(rng)]
    else:
        sub_policy = POLICIES[augment.policy][rng.randrange(len(POLICIES[augment.policy]))]
        drawn = [_timm_op(name, prob, magnitude, augment, size, rng) for name, prob, magnitude in sub_policy]
    return [op for op in drawn if op is not None and op[0] != KIND_ID["identity"]]


def _trivial(rng: random.Random) -> Op:
    """torchvision's TrivialAugmentWide: one op, a magnitude bin of 31, a sign for signed ops."""
    kind, _, _, signed = TRIVIAL_OPS[rng.randrange(len(TRIVIAL_OPS))]
    step = rng.randrange(TRIVIAL_BINS)
    if kind == "posterize":
        value = 8 - round(step / ((TRIVIAL_BINS - 1) / 6))
    else:
        value = TRIVIAL_MAGNITUDES[kind][step]
    if kind == "solarize":
        value = math.ceil(value)
    elif kind in ("translate_x", "translate_y"):
        value = int(value)  # torchvision shifts by int(magnitude) pixels
    if signed and rng.random() < 0.5:
        value = -value
    if kind in ENHANCE:
        value = 1.0 + value
    return KIND_ID[kind], float(value)


def _jitter(strengths: tuple[float, float, float], rng: random.Random) -> list[Op]:
    """torchvision's ColorJitter (brightness, contrast, saturation): a random order, then factors
    uniform in [max(0, 1 - s), 1 + s]; a strength of 0 is no op."""
    order = [0, 1, 2]
    rng.shuffle(order)
    kinds = ("brightness", "contrast", "color")
    ops = []
    for k in order:
        if strengths[k] > 0:
            ops.append((KIND_ID[kinds[k]], rng.uniform(max(0.0, 1 - strengths[k]), 1 + strengths[k])))
    return ops


def ops_row(ops: tuple[Op, ...]) -> list[float]:
    """A plan's ops as 2 * MAX_OPS numbers (kind id, parameter), identity-padded: what DALI's source sends."""
    row = [0.0] * (2 * MAX_OPS)
    for k, (kind, value) in enumerate(ops):
        row[2 * k], row[2 * k + 1] = float(kind), float(value)
    return row


def fill_color(recipe: Recipe | None) -> tuple[int, int, int]:
    """The fill of pixels a geometric op uncovers: timm's img_mean (the recipe's mean in 0..255), or
    black for TrivialAugmentWide (torchvision's default fill)."""
    if recipe is None or (recipe.augment and recipe.augment.policy == "trivialaugment"):
        return (0, 0, 0)
    return tuple(min(255, round(255 * m)) for m in recipe.mean)  # type: ignore[return-value]


Box = tuple[int, int, int, int]  # top, left, height, width


def plan_erase(recipe: Recipe, seed: int, epoch: int, index: int, size: int) -> tuple[tuple[Box, ...], int]:
    """timm's RandomErasing on a size x size view (probability, 1..re_count boxes of 2%..1/3 of the area
    over their count, log-uniform aspect 0.3..3.3, 10 tries each): the boxes, and the seed of the noise
    that fills them in 'rand' and 'pixel' modes. A stream of its own, keyed like the view's."""
    rng = random.Random(sample_rng(seed, epoch, index).getrandbits(64) ^ 0x5EED_E7A5E)
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
class MixPlan:
    """A batch's mixing: per sample its lam (1: unmixed) and, for cutmix, the box (top, bottom, left,
    right) taken from its partner N-1-i; in batch mode every sample has the same."""

    lams: np.ndarray
    boxes: tuple[tuple[int, int, int, int] | None, ...]


def plan_mix(recipe: Recipe, seed: int, epoch: int, position: Any, rank: int, count: int, height: int,
             width: int) -> MixPlan:
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
        return MixPlan(np.full(count, lams[0], dtype=np.float32), tuple(boxes * count))
    return MixPlan(lams, tuple(boxes))


def _cut_box(rng: np.random.Generator, lam: float, h: int, w: int) -> tuple[int, int, int, int, float]:
    """timm's rand_bbox + lam correction: (top, bottom, left, right, the lam of the area kept)."""
    ratio = np.sqrt(1 - lam)
    cut_h, cut_w = int(h * ratio), int(w * ratio)
    cy, cx = int(rng.integers(0, h)), int(rng.integers(0, w))
    top, bottom = int(np.clip(cy - cut_h // 2, 0, h)), int(np.clip(cy + (cut_h + 1) // 2, 0, h))  # timm 1.0.31
    left, right = int(np.clip(cx - cut_w // 2, 0, w)), int(np.clip(cx + (cut_w + 1) // 2, 0, w))
    return top, bottom, left, right, 1.0 - (bottom - top) * (right - left) / float(h * w)
