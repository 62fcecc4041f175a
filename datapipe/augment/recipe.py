"""Recipe: one training recipe's data side, declared once (timm's argument names), and the presets.

A Recipe is a frozen dataclass: the planner (datapipe.augment.plan) reads it to draw every random
choice of a record, the appliers (cpu.py, the DALI graph) and the batch stage (batch.py) read it to
apply them. Recipe() is the loader's historical view: RandomResizedCrop(scale=(0.08, 1),
ratio=(3/4, 4/3)), bilinear, horizontal flip p=0.5, ImageNet mean/std, eval crop_pct 0.875.
"""
from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from ..checks import bounded_pair, integer, is_real, probability, real, reals, shown
from ..image.geometry import MAX_ASPECT

TRAIN_INTERPOLATIONS = ("bilinear", "bicubic", "random")
EVAL_INTERPOLATIONS = ("bilinear", "bicubic")
ERASE_MODES = ("const", "rand", "pixel")
MIX_MODES = ("batch", "elem")
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
AA_POLICIES = ("rand", "trivialaugment", "ta_wide", "original", "originalr", "v0", "v0r", "augmix")
MAX_AUGMENT_OPS = 4  # RandAugment's n at most: a row holds 8 flat op slots (datapipe.augment.slots.MAX_OPS)
MAX_AUGMIX_WIDTH = 8  # AugMix's chains (timm's default 3): each is a pass over the image and DALI graph slots
MAX_AUGMIX_DEPTH = 4  # ops per AugMix chain (timm's default: 1 to 3 at random)
# AugMix's alpha at least: below it a Gamma(alpha) draw underflows to 0 (0.001: half of them), and
# every chain weight with it (timm's recipes use 1; NumPy's Dirichlet switches methods below 0.1)
MIN_AUGMIX_ALPHA = 0.05
# The ranges of the numeric fields (datapipe.checks refuses a value outside, or not finite, in one line):
# - std: 0..1-scale pixels have a std of at most 0.5 (1: no scaling), so > 1 is a 0..255-scale mistake;
#   at least 1e-4 so a normalized value, at most 1/std, stays finite in float16 (65504) and is not 0/0.
STD_RANGE = (1e-4, 1.0)
MEAN_RANGE = (0.0, 1.0)  # a mean of 0..1-scale pixels
# - crop_pct: the eval view resizes the shorter side to size / crop_pct: at 0.25, 4x the output's side
#   (timm's models use 0.75..1, torchvision's 0.875, FFCV's 224/256); timm refuses nothing, 1e-9 asked
#   for a 10^11-pixel resize at eval.
CROP_PCT_RANGE = (0.25, 1.0)
RATIO_RANGE = (1 / MAX_ASPECT, float(MAX_ASPECT))  # crop aspect ratios: the images' own bound (geometry)
MAX_ALPHA = 100.0  # mixup/cutmix beta alpha: timm's recipes use 0.1..1; Beta(100, 100) is already 0.5 +- 0.04
MAX_HUE = 0.5  # colour jitter's hue: shifts drawn in [-h, h] of the hue circle
MAX_JITTER = 10.0  # colour jitter strength: factors drawn in [max(0, 1 - s), 1 + s]; timm's default is 0.4
MAX_MAGNITUDE = 100.0  # auto-augment m and mmax: timm's levels run 0..10 (mmax may stretch them)
MAX_ERASE_COUNT = 32  # re_count: timm's max_count, 1..3 in its recipes; each box is drawn per record
MAX_AUG_REPEATS = 16  # aug_repeats: DeiT's 3, torchvision's 4; each repeat multiplies the epoch's plan


@dataclass(frozen=True)
class AutoAugment:
    """A parsed `auto_augment` string (timm's grammar): `rand-m9-n2-mstd0.5-inc1-w0`, `original-mstd0.5`,
    `originalr`, `v0`, `v0r`, `trivialaugment` (alias `ta_wide`), `augmix-m5-w4-d2-a1`."""

    policy: str
    magnitude: float = 10.0
    num_ops: int = 2
    magnitude_std: float = 0.0
    magnitude_max: float = 10.0
    increasing: bool = False
    weights: int | None = None  # `-wN`: timm's op choice weights N (only 0 exists), n ops without replacement
    width: int = 3  # AugMix: chains mixed (`-wN`)
    depth: int = 0  # AugMix: ops per chain (`-dN`; 0, timm's -1: 1 to 3 at random)
    alpha: float = 1.0  # AugMix: the Dirichlet weights' and the Beta blend's alpha (`-aN`)


@functools.lru_cache(maxsize=64)
def parse_auto_augment(text: str) -> AutoAugment:
    """timm's auto_augment string -> AutoAugment; a ValueError naming the part it cannot read."""
    parts = text.strip().split("-")
    policy = {"ta_wide": "trivialaugment"}.get(parts[0], parts[0])
    if policy not in AA_POLICIES:
        raise ValueError(f"auto_augment={shown(text)}: unknown policy {shown(parts[0])}; timm's grammar starts "
                         f"with one of {AA_POLICIES} (e.g. 'rand-m9-mstd0.5-inc1')")
    spec: dict[str, Any] = {"policy": policy}
    if policy == "augmix":  # timm's augment_and_mix_transform: severity 3, uniform magnitudes unless mstd
        spec.update(magnitude=3.0, magnitude_std=math.inf)
    keys = {"m": "magnitude", "n": "num_ops", "mstd": "magnitude_std", "mmax": "magnitude_max", "inc": "increasing",
            "w": "width" if policy == "augmix" else "weights", "d": "depth", "a": "alpha", "b": "blended"}
    allowed = {"rand": {"m", "n", "mstd", "mmax", "inc", "w"}, "trivialaugment": set(),
               "augmix": {"m", "w", "d", "a", "b", "mstd"}}.get(policy, {"mstd"})
    for part in parts[1:]:
        match = re.fullmatch(r"([a-z]+)(\d+(?:\.\d+)?)", part)
        if not match or match.group(1) not in allowed:
            raise ValueError(f"auto_augment={shown(text)}: cannot read {shown(part)}; {policy} takes "
                             f"{', '.join(sorted(k + 'N' for k in allowed)) or 'no options'}")
        key, value = keys[match.group(1)], float(match.group(2))
        if key == "magnitude_std" and value > 100:
            value = math.inf  # timm: mstd above 100 means uniform in [0, m]
        elif not math.isfinite(value):  # 400 digits read as inf
            raise ValueError(f"auto_augment={shown(text)}: {shown(part)} is past any float; m and mmax are "
                             f"within 0..{MAX_MAGNITUDE:g}, n within 1..{MAX_AUGMENT_OPS}")
        if key == "weights" and value != 0:
            raise ValueError(f"auto_augment={shown(text)}: {shown(part)}: timm has one set of op weights, w0")
        if key == "blended":
            if value:
                raise ValueError(f"auto_augment={shown(text)}: {shown(part)}: AugMix's blended mode is not carried "
                                 "(timm marks it not well tested); leave out b1")
            continue
        spec[key] = (bool(int(value)) if key == "increasing" else
                     int(value) if key in ("num_ops", "weights", "width", "depth") else value)
    if not 1 <= spec.get("num_ops", 2) <= MAX_AUGMENT_OPS:
        raise ValueError(f"auto_augment={shown(text)}: n must be within 1..{MAX_AUGMENT_OPS} ops per image")
    if not 1 <= spec.get("width", 3) <= MAX_AUGMIX_WIDTH or not 0 <= spec.get("depth", 0) <= MAX_AUGMIX_DEPTH:
        raise ValueError(f"auto_augment={shown(text)}: AugMix takes w within 1..{MAX_AUGMIX_WIDTH} chains and d "
                         f"within 0..{MAX_AUGMIX_DEPTH} ops a chain (0: 1 to 3 at random)")
    if "alpha" in spec:
        real(f"auto_augment={shown(text)}: a", spec["alpha"], MIN_AUGMIX_ALPHA, MAX_ALPHA,
             note=" (the Dirichlet and Beta alpha)")
    for key, letter in (("magnitude", "m"), ("magnitude_max", "mmax")):
        if key in spec:
            real(f"auto_augment={shown(text)}: {letter}", spec[key], 0, MAX_MAGNITUDE,
                 note=" (timm's levels run 0..10)")
    return AutoAugment(**spec)


def _choice(recipe: "Recipe", key: str, choices: tuple[str, ...], note: str = "") -> None:
    if getattr(recipe, key) not in choices:
        raise ValueError(f"{key} must be one of {choices}{note}, got {shown(getattr(recipe, key))}")


@dataclass(frozen=True)
class Recipe:
    """The data side of a training recipe. Field names follow timm's `create_transform` and `Mixup`.

    Train view: RandomResizedCrop(scale, ratio, interpolation), hflip/vflip probabilities; then either
    `auto_augment` (timm's grammar) or `color_jitter` (brightness, contrast, saturation; timm turns
    jitter off when auto_augment is set, so does this), `grayscale_prob`; normalize by mean/std;
    random erasing (`re_prob`, `re_mode`, `re_count`, on the normalized batch). Eval view: shorter side
    floor(size / crop_pct) with `eval_interpolation`, centre crop. Batch: mixup/cutmix with timm's
    Mixup semantics (`mix_mode` batch or elem), `label_smoothing` (soft targets N x classes)."""

    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    interpolation: str = "bilinear"
    hflip: float = 0.5
    vflip: float = 0.0
    color_jitter: float | tuple[float, ...] | None = None
    grayscale_prob: float = 0.0
    auto_augment: str | None = None
    re_prob: float = 0.0
    re_mode: str = "const"
    re_count: int = 1
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD
    crop_pct: float = 0.875
    eval_interpolation: str = "bilinear"
    mixup_alpha: float = 0.0
    cutmix_alpha: float = 0.0
    mixup_prob: float = 1.0
    switch_prob: float = 0.5
    mix_mode: str = "batch"
    label_smoothing: float = 0.0
    aug_repeats: int = 1
    name: str = field(default="custom", compare=False)

    def __post_init__(self) -> None:
        _choice(self, "interpolation", TRAIN_INTERPOLATIONS)
        _choice(self, "eval_interpolation", EVAL_INTERPOLATIONS)
        _choice(self, "re_mode", ERASE_MODES)
        _choice(self, "mix_mode", MIX_MODES, " (timm's 'pair' is not supported)")
        if self.auto_augment is not None:
            if not isinstance(self.auto_augment, str):
                raise ValueError(f"auto_augment must be a str in timm's grammar or None, got "
                                 f"{shown(self.auto_augment)}")
            parse_auto_augment(self.auto_augment)
        for key, value in self._checked_numbers().items():
            object.__setattr__(self, key, value)  # normalised: floats, tuples

    def _checked_numbers(self) -> dict[str, Any]:
        """Every numeric field, finite and within its range (datapipe.checks), as the value to keep."""
        found: dict[str, Any] = {
            "scale": bounded_pair("scale", self.scale, 0, 1, low_open=True, note=" (shares of the image's area)"),
            "ratio": bounded_pair("ratio", self.ratio, *RATIO_RANGE, note=" (crop aspect ratios, width / height)"),
            "crop_pct": real("crop_pct", self.crop_pct, *CROP_PCT_RANGE,
                             note=" (the eval view resizes the shorter side to size / crop_pct)"),
            "label_smoothing": real("label_smoothing", self.label_smoothing, 0, 1, high_open=True),
            "re_count": integer("re_count", self.re_count, 1, MAX_ERASE_COUNT, note=": erasing boxes per image"),
            "aug_repeats": integer("aug_repeats", self.aug_repeats, 1, MAX_AUG_REPEATS),
            "color_jitter": self._jitter(self.color_jitter),
            "mean": reals("mean", self.mean, 3, *MEAN_RANGE, note=" (RGB, on the 0..1 scale; ImageNet's: "
                          f"{IMAGENET_MEAN})"),
            "std": reals("std", self.std, 3, *STD_RANGE, note=" (RGB, on the 0..1 scale; ImageNet's: "
                         f"{IMAGENET_STD})"),
        }
        for key in ("hflip", "vflip", "grayscale_prob", "re_prob", "mixup_prob", "switch_prob"):
            found[key] = probability(key, getattr(self, key))
        for key in ("mixup_alpha", "cutmix_alpha"):
            found[key] = real(key, getattr(self, key), 0, MAX_ALPHA, note=" (0: off)")
        return found

    @staticmethod
    def _jitter(value: Any) -> tuple[float, ...] | None:
        """None (off), or (brightness, contrast, saturation[, hue]) from one number, three or four (timm's
        color_jitter; a hue of 0 is dropped, so the three factors' draws stay as they were without it)."""
        note = " (brightness, contrast, saturation[, hue]; one number: the first three)"
        if value is None or (is_real(value) and value == 0):
            return None
        if is_real(value) or isinstance(value, (str, bytes)):
            return (real("color_jitter", value, 0, MAX_JITTER, note=note),) * 3
        items = tuple(value) if isinstance(value, Iterable) else value
        if isinstance(items, tuple) and len(items) == 4:
            hue = real("color_jitter's hue", items[3], 0, MAX_HUE, note=" (torchvision: a shift within -0.5..0.5)")
            factors = reals("color_jitter", items[:3], 3, 0, MAX_JITTER, note=note)
            return factors + (hue,) if hue > 0 else factors
        return reals("color_jitter", items, 3, 0, MAX_JITTER, note=note)  # type: ignore[return-value]

    @property
    def augment(self) -> AutoAugment | None:
        return parse_auto_augment(self.auto_augment) if self.auto_augment else None

    @property
    def jitter(self) -> tuple[float, ...] | None:
        """The colour jitter in use: none when auto_augment is set (timm's create_transform)."""
        return None if self.auto_augment else self.color_jitter  # type: ignore[return-value]

    @property
    def mixes(self) -> bool:
        return self.mixup_alpha > 0 or self.cutmix_alpha > 0

    @property
    def soft_targets(self) -> bool:
        """Labels become N x classes soft targets (timm's convention): mixup, cutmix or smoothing on."""
        return self.mixes or self.label_smoothing > 0

    @property
    def batch_stage(self) -> bool:
        return self.soft_targets or self.re_prob > 0

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe fields (a checkpoint's and TensorBoard's record of the recipe); name included."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Recipe":
        known = {f.name for f in fields(cls)}
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k in known})

    def describe_difference(self, other: "Recipe") -> str:
        """The fields where two recipes differ, as 'key: a != b'."""
        a, b = self.to_dict(), other.to_dict()
        return ", ".join(f"{k}: {a[k]!r} != {b[k]!r}" for k in a if k != "name" and a[k] != b[k])


# The presets, each from its own source (docs/augmentation.md has the table and the links).
PRESETS: dict[str, Recipe] = {
    "default": Recipe(name="default"),
    # timm ResNet Strikes Back A3 (arXiv 2110.00476, timm's train args); 160 px train, 224 test: PRESET_SIZES.
    "rsb-a3": Recipe(name="rsb-a3", interpolation="bicubic", auto_augment="rand-m6-mstd0.5-inc1",
                     mixup_alpha=0.1, cutmix_alpha=1.0, crop_pct=0.95, eval_interpolation="bicubic"),
    # DeiT (facebookresearch/deit main.py defaults).
    "deit": Recipe(name="deit", interpolation="bicubic", auto_augment="rand-m9-mstd0.5-inc1", re_prob=0.25,
                   re_mode="pixel", mixup_alpha=0.8, cutmix_alpha=1.0, switch_prob=0.5, label_smoothing=0.1,
                   aug_repeats=3, crop_pct=0.875, eval_interpolation="bicubic"),
    # FFCV ResNet-50 (ffcv-imagenet rn50 configs): crop + flip, smoothing; its 160 -> 192 ramp and 256 eval
    # are in PRESET_SIZES.
    "ffcv-rn50": Recipe(name="ffcv-rn50", label_smoothing=0.1, crop_pct=224 / 256),
    # torchvision's "new recipe" ResNet-50 V2 (torchvision references/classification, IMAGENET1K_V2).
    "tv-v2": Recipe(name="tv-v2", auto_augment="ta_wide", re_prob=0.1, re_mode="const", mixup_alpha=0.2,
                    cutmix_alpha=1.0, label_smoothing=0.1, aug_repeats=4, crop_pct=224 / 232),
}


@dataclass(frozen=True)
class PresetSizes:
    """The image sizes a preset's authors trained and evaluated at. `train`: a size, or "MIN:MAX" for
    FFCV's ramp over the run (datapipe.augment.resolution.ffcv_ramp); `eval`: None evaluates at the last
    train size. `datapipe train` serves them when --image-size and --eval-size are not given."""

    train: int | str
    eval: int | None = None


PRESET_SIZES: dict[str, PresetSizes] = {
    "default": PresetSizes(224),
    "rsb-a3": PresetSizes(160, eval=224),  # RSB A3: train 160, test 224 (arXiv 2110.00476, table 1)
    "deit": PresetSizes(224),
    # ffcv-imagenet rn50 configs: min_res 160, max_res 192 (start_ramp/end_ramp scaled: ffcv_ramp),
    # validation.resolution 256 through a 224/256 centre crop (crop_pct above)
    "ffcv-rn50": PresetSizes("160:192", eval=256),
    "tv-v2": PresetSizes(176, eval=224),  # torchvision: --train-crop-size 176, --val-resize-size 232 (crop 224)
}


def preset_sizes(recipe: Recipe) -> PresetSizes:
    """The sizes of a recipe's preset (a preset changed by flags, "deit+", keeps them); the default's else."""
    return PRESET_SIZES.get(recipe.name.rstrip("+"), PRESET_SIZES["default"])


def resolve_recipe(recipe: "Recipe | str | None", **overrides: Any) -> Recipe:
    """A Recipe from a Recipe, a preset name or None (the default), with field overrides applied."""
    if recipe is None:
        base = PRESETS["default"]
    elif isinstance(recipe, Recipe):
        base = recipe
    elif isinstance(recipe, str) and recipe in PRESETS:
        base = PRESETS[recipe]
    else:
        raise ValueError(f"recipe must be a datapipe.Recipe or one of {sorted(PRESETS)}, got {recipe!r}")
    if not overrides:
        return base
    unknown = set(overrides) - {f.name for f in fields(Recipe)}
    if unknown:
        raise ValueError(f"unknown recipe field(s) {sorted(unknown)}; Recipe takes {[f.name for f in fields(Recipe)]}")
    return replace(base, **overrides, name=f"{base.name}+" if base.name != "custom" else "custom")
