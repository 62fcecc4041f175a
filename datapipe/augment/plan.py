"""The planner: every random choice of one record in one epoch, drawn in one call.

plan_sample(recipe, seed, epoch, key, size, width, height) -> a SamplePlan, a flat frozen value: the
view (crop box and flip, interpolation; or the eval view's centre crop), the pixel ops with their final
parameters in the order they apply (vertical flip, the auto-augment ops, the colour jitter in its drawn
order, grayscale) and the seed of the user's transform. Each backend makes this one call per record
and hands the value to its decoder (datapipe.augment.view, the DALI source's view columns) and its
applier (augment.cpu, augment.dali): no backend draws a number, no random.Random leaves this module, so
a record gets the same augmentation whichever backend, process or machine serves it.

Pure: random.Random streams keyed by (seed, epoch, record key); the draw order is fixed (crop, hflip,
[interpolation], [vflip], auto-augment, [jitter], [grayscale], the transform seed), so the default
recipe's crops equal the loader's historical ones. The batch stage's draws (erasing, mixing) are
augment.batch_plan's. The standard library only (the op table and the recipe are too): DALI's source
workers and the CLI import it without torch, DALI or NumPy.
"""
from __future__ import annotations

import math
import random
import struct
from collections.abc import Callable
from dataclasses import dataclass

from ..image.geometry import RATIO, SCALE, Crop, crop_pct_of
from .ops import KIND_ID, TABLE, TIMM_OPS, TRIVIAL_BINS, Hparams
from .policies import (AUGMIX_OPS, AUGMIX_TRANSLATE_PCT, POLICIES, RAND_INCREASING_OPS, RAND_OPS, TRIVIAL_ORDER,
                       rand_weights)
from .recipe import AutoAugment, Recipe

Op = tuple[int, float]  # (kind id, parameter)


@dataclass(frozen=True)
class SamplePlan:
    """A record's whole augmentation at output `size`: the train view's crop box and flip (None: the
    eval view, the centre crop of the image resized to size / crop_pct), the resize's interpolation,
    the pixel ops (kind id, final parameter) in order, AugMix's chains where the recipe has it, and
    the seed of the user's transform."""

    size: int
    crop: Crop | None
    interpolation: str
    crop_pct: float
    ops: tuple[Op, ...] = ()
    transform_seed: int = 0
    augmix: "AugMixPlan | None" = None  # AugMix: applied after ops[:augmix_at], before the rest
    augmix_at: int = 0


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
    ops, mix, augmix_at = _ops(recipe, size, rng)
    return SamplePlan(size, crop, interpolation, crop_pct, ops, rng.getrandbits(63), mix, augmix_at)


@dataclass(frozen=True)
class AugMixPlan:
    """AugMix (timm's AugMixAugment, plain mode): each chain's ops applied to the image, the results
    summed by `weights` (float32) in float32, clipped and truncated to uint8, then blended with the
    image by `m` (PIL's Image.blend)."""

    chains: tuple[tuple[Op, ...], ...]
    weights: tuple[float, ...]
    m: float


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


def _ops(recipe: Recipe | None, size: int, rng: random.Random) -> tuple[tuple[Op, ...], AugMixPlan | None, int]:
    """The pixel ops after the view, drawn right after its draws, stage by stage (STAGES); AugMix's
    chains and how many ops come before them."""
    if recipe is None:
        return (), None, 0
    ops: list[Op] = []
    mix, augmix_at = None, 0
    for stage in STAGES:
        if stage.used(recipe):
            drawn = stage.draw(recipe, size, rng)
            if isinstance(drawn, AugMixPlan):
                mix, augmix_at = drawn, len(ops)
            else:
                ops.extend(drawn)
    return tuple(ops), mix, augmix_at if mix else len(ops)


Kinds = frozenset[str]


@dataclass(frozen=True)
class Stage:
    """One stage of a record's pixel ops, in draw order: whether a recipe uses it, its draws (ops, or
    an AugMixPlan), and what it can hold (the most ops and their kinds; for AugMix the chains, their
    depth and kinds): what augment/slots.py builds the DALI graph from, beside the draws."""

    used: Callable[[Recipe], bool]
    draw: Callable[[Recipe, int, random.Random], "list[Op] | AugMixPlan"]
    bounds: Callable[[Recipe], tuple]
    augmix: bool = False


def _flip_draw(kind: str, prob: Callable[[Recipe], float]) -> Callable[[Recipe, int, random.Random], list[Op]]:
    return lambda recipe, size, rng: [(KIND_ID[kind], 0.0)] if rng.random() < prob(recipe) else []


STAGES: tuple[Stage, ...] = (
    Stage(lambda r: r.vflip > 0, _flip_draw("vflip", lambda r: r.vflip), lambda r: (1, frozenset({"vflip"}))),
    Stage(lambda r: r.augment is not None and r.augment.policy != "augmix",
          lambda r, size, rng: _auto_augment(r.augment, size, rng), lambda r: _auto_augment_bounds(r.augment)),
    Stage(lambda r: r.augment is not None and r.augment.policy == "augmix",
          lambda r, size, rng: _augmix(r.augment, size, rng),
          lambda r: (r.augment.width, r.augment.depth or 3, frozenset(TIMM_OPS[name].kind for name in AUGMIX_OPS)),
          augmix=True),
    Stage(lambda r: r.jitter is not None, lambda r, size, rng: _jitter(r.jitter, rng),
          lambda r: (sum(s > 0 for s in r.jitter), frozenset(k for k, s in zip(JITTER_KINDS, r.jitter) if s > 0))),
    Stage(lambda r: r.grayscale_prob > 0, _flip_draw("grayscale", lambda r: r.grayscale_prob),
          lambda r: (1, frozenset({"grayscale"}))),
)


def _auto_augment_bounds(augment: AutoAugment) -> tuple[int, Kinds]:
    if augment.policy == "rand":
        names = RAND_INCREASING_OPS if augment.increasing else RAND_OPS
        weights = rand_weights(augment.weights) or (1.0,) * len(names)
        return augment.num_ops, frozenset(TIMM_OPS[name].kind for name, w in zip(names, weights) if w > 0)
    if augment.policy == "trivialaugment":
        return 1, frozenset(TRIVIAL_ORDER)
    policy = POLICIES[augment.policy]
    return max(len(sub) for sub in policy), frozenset(TIMM_OPS[name].kind for sub in policy for name, *_ in sub)


def _augmix(augment: AutoAugment, size: int, rng: random.Random) -> AugMixPlan:
    """timm's AugMixAugment draws: Dirichlet chain weights and a Beta blend (float32, as timm casts
    them), then per chain its depth (1 to 3 at random unless given) and its ops, with replacement
    from AUGMIX_OPS, each applied (prob 1) at a magnitude uniform in 0..m (timm's AugMix default)."""
    gammas = [rng.gammavariate(augment.alpha, 1.0) for _ in range(augment.width)]
    total = sum(gammas) or 1.0  # every draw 0 (alpha >= MIN_AUGMIX_ALPHA: p < 1e-15): the image unmixed
    weights = tuple(_float32(g / total) for g in gammas)
    m = _float32(rng.betavariate(augment.alpha, augment.alpha))
    hparams = Hparams(size, AUGMIX_TRANSLATE_PCT)
    chains = []
    for _ in weights:
        depth = augment.depth or rng.randint(1, 3)
        names = [AUGMIX_OPS[rng.randrange(len(AUGMIX_OPS))] for _ in range(depth)]
        drawn = [_timm_op(name, 1.0, augment.magnitude, augment, hparams, rng) for name in names]
        chains.append(tuple(op for op in drawn if op is not None and op[0] != KIND_ID["identity"]))
    return AugMixPlan(tuple(chains), weights, m)


def _float32(value: float) -> float:
    return struct.unpack("f", struct.pack("f", value))[0]


def _timm_op(name: str, prob: float, magnitude: float, augment: AutoAugment, hparams: Hparams,
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
    value = spec.level(magnitude, hparams) if spec.level else 0.0
    if spec.negate and rng.random() > 0.5:
        value = -value
    if spec.finish:
        value = spec.finish(value)
    return KIND_ID[spec.kind], float(value)


def _auto_augment(augment: AutoAugment, size: int, rng: random.Random) -> list[Op]:
    drawn: list[Op | None]
    hparams = Hparams(size)
    if augment.policy == "rand":
        drawn = [_timm_op(name, 0.5, augment.magnitude, augment, hparams, rng) for name in _rand_choice(augment, rng)]
    elif augment.policy == "trivialaugment":
        drawn = [_trivial(rng)]
    else:
        sub_policy = POLICIES[augment.policy][rng.randrange(len(POLICIES[augment.policy]))]
        drawn = [_timm_op(name, prob, magnitude, augment, hparams, rng) for name, prob, magnitude in sub_policy]
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
        point, k = rng.random() * sum(left), max(i for i, w in enumerate(left) if w > 0)
        for i, weight in enumerate(left):  # the first op whose cumulative weight passes the point
            if weight > 0 and point < weight:
                k = i
                break
            point -= weight
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
        if strengths[k] > 0:  # each kind's range and parameter rule: its `jitter` entry in the op table
            rule = TABLE[JITTER_KINDS[k]].jitter
            ops.append((KIND_ID[JITTER_KINDS[k]], float(rule.finish(rng.uniform(*rule.bounds(strengths[k]))))))
    return ops


def fill_color(recipe: Recipe | None) -> tuple[int, int, int]:
    """The fill of pixels a geometric op uncovers: timm's img_mean (the recipe's mean in 0..255), or
    black for TrivialAugmentWide (torchvision's default fill)."""
    if recipe is None or (recipe.augment and recipe.augment.policy == "trivialaugment"):
        return (0, 0, 0)
    return tuple(min(255, round(255 * m)) for m in recipe.mean)  # type: ignore[return-value]
