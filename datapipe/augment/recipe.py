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
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

TRAIN_INTERPOLATIONS = ("bilinear", "bicubic", "random")
EVAL_INTERPOLATIONS = ("bilinear", "bicubic")
ERASE_MODES = ("const", "rand", "pixel")
MIX_MODES = ("batch", "elem")
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
AA_POLICIES = ("rand", "trivialaugment", "ta_wide", "original", "originalr", "v0", "v0r")
MAX_AUGMENT_OPS = 4  # RandAugment's n at most: a plan row holds 8 op slots (datapipe.augment.plan.MAX_OPS)


@dataclass(frozen=True)
class AutoAugment:
    """A parsed `auto_augment` string (timm's grammar): `rand-m9-n2-mstd0.5-inc1`, `original-mstd0.5`,
    `originalr`, `v0`, `v0r`, `trivialaugment` (alias `ta_wide`)."""

    policy: str
    magnitude: float = 10.0
    num_ops: int = 2
    magnitude_std: float = 0.0
    magnitude_max: float = 10.0
    increasing: bool = False


@functools.lru_cache(maxsize=64)
def parse_auto_augment(text: str) -> AutoAugment:
    """timm's auto_augment string -> AutoAugment; a ValueError naming the part it cannot read."""
    parts = text.strip().split("-")
    policy = {"ta_wide": "trivialaugment"}.get(parts[0], parts[0])
    if policy == "augmix":
        raise ValueError(f"auto_augment={text!r}: AugMix is not supported yet; use rand-m9-mstd0.5-inc1, "
                         "trivialaugment or original")
    if policy not in AA_POLICIES:
        raise ValueError(f"auto_augment={text!r}: unknown policy {parts[0]!r}; timm's grammar starts with one of "
                         f"{AA_POLICIES} (e.g. 'rand-m9-mstd0.5-inc1')")
    spec: dict[str, Any] = {"policy": policy}
    keys = {"m": "magnitude", "n": "num_ops", "mstd": "magnitude_std", "mmax": "magnitude_max", "inc": "increasing"}
    allowed = {"rand": set(keys), "trivialaugment": set()}.get(policy, {"mstd"})
    for part in parts[1:]:
        match = re.fullmatch(r"([a-z]+)(\d+(?:\.\d+)?)", part)
        if not match or match.group(1) not in allowed:
            raise ValueError(f"auto_augment={text!r}: cannot read {part!r}; {policy} takes "
                             f"{', '.join(sorted(k + 'N' for k in allowed)) or 'no options'}")
        key, value = keys[match.group(1)], float(match.group(2))
        if key == "magnitude_std" and value > 100:
            value = math.inf  # timm: mstd above 100 means uniform in [0, m]
        spec[key] = bool(int(value)) if key == "increasing" else int(value) if key == "num_ops" else value
    if not 1 <= spec.get("num_ops", 2) <= MAX_AUGMENT_OPS:
        raise ValueError(f"auto_augment={text!r}: n must be within 1..{MAX_AUGMENT_OPS} ops per image")
    return AutoAugment(**spec)


def _choice(recipe: "Recipe", key: str, choices: tuple[str, ...], note: str = "") -> None:
    if getattr(recipe, key) not in choices:
        raise ValueError(f"{key} must be one of {choices}{note}, got {getattr(recipe, key)!r}")


def _number(recipe: "Recipe", key: str, low: float, high: float, rule: str) -> float:
    """The field as a float within [low, high], else a ValueError naming it."""
    value = getattr(recipe, key)
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if isinstance(value, (bool, str)) or not low <= number <= high:
        raise ValueError(f"{key} must be {rule}, got {value!r}")
    return number


def _triple(value: Any, name: str) -> tuple[float, float, float]:
    try:
        values = tuple(float(v) for v in value)
    except (TypeError, ValueError):
        values = ()
    if len(values) != 3:
        raise ValueError(f"{name} must be 3 numbers (RGB, on the 0..1 scale), got {value!r}")
    return values  # type: ignore[return-value]


def _pair(value: Any, name: str) -> tuple[float, float]:
    try:
        low, high = (float(v) for v in value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a pair (low, high), got {value!r}") from None
    if not 0 < low <= high:
        raise ValueError(f"{name} must satisfy 0 < low <= high, got {value!r}")
    return low, high


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
        set_ = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731 (normalising a frozen instance)
        set_("scale", _pair(self.scale, "scale"))
        set_("ratio", _pair(self.ratio, "ratio"))
        if self.scale[1] > 1:
            raise ValueError(f"scale is a share of the image's area, at most 1, got {self.scale!r}")
        _choice(self, "interpolation", TRAIN_INTERPOLATIONS)
        _choice(self, "eval_interpolation", EVAL_INTERPOLATIONS)
        _choice(self, "re_mode", ERASE_MODES)
        _choice(self, "mix_mode", MIX_MODES, " (timm's 'pair' is not supported)")
        for key in ("hflip", "vflip", "grayscale_prob", "re_prob", "mixup_prob", "switch_prob"):
            set_(key, _number(self, key, 0, 1, "a probability, a number within 0..1"))
        set_("crop_pct", _number(self, "crop_pct", 1e-9, 1, "a number within (0, 1]"))
        set_("mixup_alpha", _number(self, "mixup_alpha", 0, math.inf, "a number >= 0"))
        set_("cutmix_alpha", _number(self, "cutmix_alpha", 0, math.inf, "a number >= 0"))
        set_("label_smoothing", _number(self, "label_smoothing", 0, 0.999999, "a number within [0, 1)"))
        for key in ("re_count", "aug_repeats"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{key} must be an int >= 1, got {value!r}")
        set_("color_jitter", self._jitter(self.color_jitter))
        if self.auto_augment is not None:
            parse_auto_augment(self.auto_augment)
        set_("mean", _triple(self.mean, "mean"))
        set_("std", _triple(self.std, "std"))
        if min(self.std) <= 0:
            raise ValueError(f"std must be > 0 in every channel, got {self.std}")

    @staticmethod
    def _jitter(value: Any) -> tuple[float, float, float] | None:
        if value is None or value == 0:
            return None
        values = (float(value),) * 3 if isinstance(value, (int, float)) else tuple(float(v) for v in value)
        if len(values) == 4 and values[3] == 0:
            values = values[:3]
        if len(values) != 3 or min(values) < 0:
            raise ValueError(f"color_jitter is one float or (brightness, contrast, saturation), each >= 0; "
                             f"got {value!r} (hue jitter is not supported yet)")
        return values  # type: ignore[return-value]

    @property
    def augment(self) -> AutoAugment | None:
        return parse_auto_augment(self.auto_augment) if self.auto_augment else None

    @property
    def jitter(self) -> tuple[float, float, float] | None:
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
    # timm ResNet Strikes Back A3 (arXiv 2110.00476, timm's train args): 160 px train, 224 test.
    "rsb-a3": Recipe(name="rsb-a3", interpolation="bicubic", auto_augment="rand-m6-mstd0.5-inc1",
                     mixup_alpha=0.1, cutmix_alpha=1.0, crop_pct=0.95, eval_interpolation="bicubic"),
    # DeiT (facebookresearch/deit main.py defaults).
    "deit": Recipe(name="deit", interpolation="bicubic", auto_augment="rand-m9-mstd0.5-inc1", re_prob=0.25,
                   re_mode="pixel", mixup_alpha=0.8, cutmix_alpha=1.0, switch_prob=0.5, label_smoothing=0.1,
                   aug_repeats=3, crop_pct=0.875, eval_interpolation="bicubic"),
    # FFCV ResNet-50 (ffcv-imagenet rn50 configs): crop + flip, resolution ramp 160 -> 192, smoothing.
    "ffcv-rn50": Recipe(name="ffcv-rn50", label_smoothing=0.1, crop_pct=224 / 256),
    # torchvision's "new recipe" ResNet-50 V2 (torchvision references/classification, IMAGENET1K_V2).
    "tv-v2": Recipe(name="tv-v2", auto_augment="ta_wide", re_prob=0.1, re_mode="const", mixup_alpha=0.2,
                    cutmix_alpha=1.0, label_smoothing=0.1, aug_repeats=4, crop_pct=224 / 232),
}
# The train sizes those recipes use (the loader's image_size is the user's to set).
PRESET_TRAIN_SIZES = {"rsb-a3": 160, "deit": 224, "ffcv-rn50": 160, "tv-v2": 176, "default": 224}


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
