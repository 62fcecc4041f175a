"""The planner: every random choice of one record in one epoch, drawn in one call.

plan_sample(recipe, seed, epoch, key, size, width, height) -> a SamplePlan, a flat frozen value: the
view (crop box and flip, interpolation; or the eval view's centre crop), the pixel ops with their final
parameters in the order they apply (vertical flip, the auto-augment ops, the colour jitter in its drawn
order, grayscale) and the seed of the user's transform. Each backend makes this one call per record
and hands the value to its decoder (datapipe.transforms, the DALI source's view columns) and its
applier (augment.cpu, augment.dali): no backend draws a number, no random.Random leaves this module, so
a record gets the same augmentation whichever backend, process or machine serves it.

Pure: random.Random streams keyed by (seed, epoch, record key); the draw order is fixed (crop, hflip,
[interpolation], [vflip], auto-augment, [jitter], [grayscale], the transform seed), so the default
recipe's crops equal the loader's historical ones. The batch stage's draws (erasing, mixing) are
augment.batch_plan's. Stdlib only, apart from the recipe: DALI's source workers and the CLI import it.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass

from ..geometry import RATIO, SCALE, Crop, crop_pct_of
from .ops import KIND_ID, TABLE, TIMM_OPS, TRIVIAL_BINS
from .policies import POLICIES, RAND_INCREASING_OPS, RAND_OPS, TRIVIAL_ORDER, rand_weights
from .recipe import AutoAugment, Recipe

MAX_OPS = 8  # op slots of a plan row: vflip + up to 4 auto-augment ops + 3 jitter + grayscale
Op = tuple[int, float]  # (kind id, parameter)


@dataclass(frozen=True)
class SamplePlan:
    """A record's whole augmentation at output `size`: the train view's crop box and flip (None: the
    eval view, the centre crop of the image resized to size / crop_pct), the resize's interpolation,
    the pixel ops (kind id, final parameter) in order, and the seed of the user's transform."""

    size: int
    crop: Crop | None
    interpolation: str
    crop_pct: float
    ops: tuple[Op, ...] = ()
    transform_seed: int = 0

    def row(self) -> list[float]:
        return ops_row(self.ops)


def plan_sample(recipe: Recipe | None, seed: int, epoch: int, key: int, size: int, width: int, height: int,
                *, train: bool = True) -> SamplePlan:
    """The plan of record `key` (a width x height upright image) in `epoch` at output `size`; `recipe`
    None is the default recipe (crop and flip). The eval view draws nothing."""
    crop_pct = crop_pct_of(recipe)
    if not train:
        return SamplePlan(size, None, "bilinear" if recipe is None else recipe.eval_interpolation, crop_pct)
    rng = sample_rng(seed, epoch, key)
    if recipe is None:
        crop, interpolation = random_resized_crop(width, height, rng), "bilinear"
    else:
        crop = random_resized_crop(width, height, rng, recipe.scale, recipe.ratio, recipe.hflip)
        interpolation = recipe.interpolation
        if interpolation == "random":  # timm's RandomResizedCropAndInterpolation: bilinear or bicubic
            interpolation = ("bilinear", "bicubic")[rng.random() < 0.5]
    ops = _ops(recipe, size, rng)
    return SamplePlan(size, crop, interpolation, crop_pct, ops, rng.getrandbits(63))


def stream_seed(seed: int, epoch: int, key: int) -> int:
    """The seed of one record's draws in one epoch: independent of worker, batch and rank."""
    return (seed * 1_000_003 + epoch) * 4_294_967_296 + key


def sample_rng(seed: int, epoch: int, key: int) -> random.Random:
    """The stream a record's plan is drawn from (stream_seed); it never leaves this module."""
    return random.Random(stream_seed(seed, epoch, key))


def random_resized_crop(width: int, height: int, rng: random.Random, scale: tuple[float, float] = SCALE,
                        ratio: tuple[float, float] = RATIO, hflip: float = 0.5) -> Crop:
    """torchvision's RandomResizedCrop sampling: 10 tries of (area, log-ratio), then a centre fallback;
    then the horizontal flip, drawn with probability `hflip` (one draw whatever its value)."""
    area = width * height
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target = area * rng.uniform(*scale)
        aspect = math.exp(rng.uniform(*log_ratio))
        w, h = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            return Crop(rng.randint(0, width - w), rng.randint(0, height - h), w, h, rng.random() < hflip)
    in_ratio = width / height
    if in_ratio < ratio[0]:
        w, h = width, round(width / ratio[0])
    elif in_ratio > ratio[1]:
        w, h = round(height * ratio[1]), height
    else:
        w, h = width, height
    return Crop((width - w) // 2, (height - h) // 2, w, h, rng.random() < hflip)


def _ops(recipe: Recipe | None, size: int, rng: random.Random) -> tuple[Op, ...]:
    """The pixel ops after the view, drawn right after its draws."""
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
    return tuple(ops)


@dataclass(frozen=True)
class OpBounds:
    """What a recipe's plans can hold: `slots` ops at most, of `kinds` (names in id order, identity
    first): what the DALI graph builds (augment.dali), read from the draws below, never restated."""

    slots: int
    kinds: tuple[str, ...]


def op_bounds(recipe: Recipe | None) -> OpBounds:
    """The most ops and the kinds `_ops` can draw for `recipe`; none for None or the default recipe."""
    if recipe is None:
        return OpBounds(0, ("identity",))
    stages: list[tuple[int, set[str]]] = [(1, {"vflip"})] if recipe.vflip > 0 else []
    augment = recipe.augment
    if augment is not None:
        stages.append(_auto_augment_bounds(augment))
    if recipe.jitter is not None:
        drawn = {kind for kind, strength in zip(JITTER_KINDS, recipe.jitter) if strength > 0}
        stages.append((len(drawn), drawn))
    if recipe.grayscale_prob > 0:
        stages.append((1, {"grayscale"}))
    kinds = {"identity"}.union(*(k for _, k in stages))
    return OpBounds(sum(n for n, _ in stages), tuple(sorted(kinds, key=KIND_ID.__getitem__)))


def _auto_augment_bounds(augment: AutoAugment) -> tuple[int, set[str]]:
    if augment.policy == "rand":
        names = RAND_INCREASING_OPS if augment.increasing else RAND_OPS
        weights = rand_weights(augment.weights) or (1.0,) * len(names)
        return augment.num_ops, {TIMM_OPS[name].kind for name, w in zip(names, weights) if w > 0}
    if augment.policy == "trivialaugment":
        return 1, set(TRIVIAL_ORDER)
    policy = POLICIES[augment.policy]
    return max(len(sub) for sub in policy), {TIMM_OPS[name].kind for sub in policy for name, *_ in sub}


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
        drawn = [_timm_op(name, 0.5, augment.magnitude, augment, size, rng) for name in _rand_choice(augment, rng)]
    elif augment.policy == "trivialaugment":
        drawn = [_trivial(rng)]
    else:
        sub_policy = POLICIES[augment.policy][rng.randrange(len(POLICIES[augment.policy]))]
        drawn = [_timm_op(name, prob, magnitude, augment, size, rng) for name, prob, magnitude in sub_policy]
    return [op for op in drawn if op is not None and op[0] != KIND_ID["identity"]]


def _rand_choice(augment: AutoAugment, rng: random.Random) -> list[str]:
    """RandAugment's n op names: uniform with replacement, or (`-w0`) by timm's weights without
    replacement (NumPy's choice(replace=False, p): each next op by the weights of those left)."""
    names = RAND_INCREASING_OPS if augment.increasing else RAND_OPS
    weights = rand_weights(augment.weights)
    if weights is None:
        return [names[rng.randrange(len(names))] for _ in range(augment.num_ops)]
    left, chosen = list(weights), []
    for _ in range(augment.num_ops):
        point, k = rng.random() * sum(left), 0
        while k < len(left) - 1 and (left[k] == 0 or point >= left[k]):
            point -= left[k]
            k += 1
        chosen.append(names[k])
        left[k] = 0.0
    return chosen


def _trivial(rng: random.Random) -> Op:
    """torchvision's TrivialAugmentWide: one op, a magnitude bin of 31, a sign for signed ops (each
    kind's `trivial` rule in the op table)."""
    kind = TRIVIAL_ORDER[rng.randrange(len(TRIVIAL_ORDER))]
    rule = TABLE[kind].trivial
    value = rule.magnitude(rng.randrange(TRIVIAL_BINS))
    if rule.finish:
        value = rule.finish(value)
    if rule.signed and rng.random() < 0.5:
        value = -value
    return KIND_ID[kind], float(value + rule.offset)


JITTER_KINDS = ("brightness", "contrast", "color", "hue")


def _jitter(strengths: tuple[float, ...], rng: random.Random) -> list[Op]:
    """torchvision's ColorJitter (brightness, contrast, saturation[, hue]): a random order, then factors
    uniform in [max(0, 1 - s), 1 + s], the hue's shift in [-h, h]; a strength of 0 is no op."""
    order = list(range(len(strengths)))
    rng.shuffle(order)
    ops = []
    for k in order:
        if strengths[k] > 0:
            if k == 3:  # torchvision's adjust_hue shifts the 8-bit hue channel by int(factor * 255), wrapped
                ops.append((KIND_ID["hue"], float(int(rng.uniform(-strengths[k], strengths[k]) * 255) % 256)))
            else:
                ops.append((KIND_ID[JITTER_KINDS[k]], rng.uniform(max(0.0, 1 - strengths[k]), 1 + strengths[k])))
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
