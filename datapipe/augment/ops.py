"""The op table: every augmentation op a plan may hold, as one entry each.

`KINDS` are what an applier implements (cpu.py, the DALI graph): one function per kind, taking the
image and one number, the op's final parameter. `TIMM_OPS` are timm's op names (auto_augment.py's
NAME_TO_OP / LEVEL_TO_ARG) as (kind, magnitude -> parameter, randomly negated): the planner reads
them to draw, so a new op is one entry here plus one applier per backend. Pure Python: DALI's
source workers import it.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from .trivial_bins import BINS

# The applier kinds, in id order (a plan row stores the id). The parameter of each:
KINDS = (
    "identity",       # -
    "auto_contrast",  # - (PIL ImageOps.autocontrast, per channel)
    "equalize",       # - (PIL ImageOps.equalize, per channel)
    "invert",         # -
    "rotate",         # degrees, counter-clockwise about the centre (PIL Image.rotate)
    "posterize",      # bits kept, 0..8 (0: black, as timm's level 0 asks; DALI's auto_aug maps 0 to 1)
    "solarize",       # threshold: values >= it are inverted
    "solarize_add",   # added to values < 128, saturating
    "color",          # saturation factor (PIL ImageEnhance.Color: blend with the L image)
    "contrast",       # factor (ImageEnhance.Contrast: blend with the L image's mean)
    "brightness",     # factor (ImageEnhance.Brightness: blend with black)
    "sharpness",      # factor (ImageEnhance.Sharpness: blend with PIL's SMOOTH filter, border kept)
    "shear_x",        # factor: input x = x + factor * y (PIL's affine, about the top-left corner)
    "shear_y",        # factor: input y = y + factor * x
    "translate_x",    # pixels: input x = x + pixels
    "translate_y",    # pixels: input y = y + pixels
    "vflip",          # - (a vertical flip)
    "grayscale",      # - (the L image in all three channels)
)
KIND_ID = {name: k for k, name in enumerate(KINDS)}
Matrix = tuple[float, float, float, float, float, float]
LEVEL_MAX = 10.0  # timm's _LEVEL_DENOM


@dataclass(frozen=True)
class OpSpec:
    """A named op: its kind, how a magnitude (0..10, timm's scale) becomes the kind's parameter, and
    whether that parameter is negated with probability 1/2 before `finish` (timm's _randomly_negate)."""

    kind: str
    level: Callable[[float, int], float] | None = None  # (magnitude, image size) -> parameter
    negate: bool = False
    finish: Callable[[float], float] | None = None


def _scaled(top: float) -> Callable[[float, int], float]:
    return lambda m, size: m / LEVEL_MAX * top


def _enhance(m: float, size: int) -> float:
    return m / LEVEL_MAX * 1.8 + 0.1


def _posterize(m: float, size: int) -> float:
    return int(m / LEVEL_MAX * 4)


def _solarize(m: float, size: int) -> float:
    return min(256, int(m / LEVEL_MAX * 256))  # timm clamps past magnitude 10 (mmax > 10)


TIMM_OPS: dict[str, OpSpec] = {
    "AutoContrast": OpSpec("auto_contrast"),
    "Equalize": OpSpec("equalize"),
    "Invert": OpSpec("invert"),
    "Rotate": OpSpec("rotate", _scaled(30.0), negate=True),
    "Posterize": OpSpec("posterize", _posterize),
    "PosterizeIncreasing": OpSpec("posterize", lambda m, s: 4 - _posterize(m, s)),
    "PosterizeOriginal": OpSpec("posterize", lambda m, s: _posterize(m, s) + 4),
    "Solarize": OpSpec("solarize", _solarize),
    "SolarizeIncreasing": OpSpec("solarize", lambda m, s: 256 - _solarize(m, s)),
    "SolarizeAdd": OpSpec("solarize_add", lambda m, s: min(128, int(m / LEVEL_MAX * 110))),  # timm's clamp
    "Color": OpSpec("color", _enhance),
    "Contrast": OpSpec("contrast", _enhance),
    "Brightness": OpSpec("brightness", _enhance),
    "Sharpness": OpSpec("sharpness", _enhance),
    "ShearX": OpSpec("shear_x", _scaled(0.3), negate=True),
    "ShearY": OpSpec("shear_y", _scaled(0.3), negate=True),
    "TranslateXRel": OpSpec("translate_x", lambda m, size: m / LEVEL_MAX * 0.45 * size, negate=True),
    "TranslateYRel": OpSpec("translate_y", lambda m, size: m / LEVEL_MAX * 0.45 * size, negate=True),
}
for _name, _kind in (("Color", "color"), ("Contrast", "contrast"), ("Brightness", "brightness"), ("Sharpness", "sharpness")):
    TIMM_OPS[f"{_name}Increasing"] = OpSpec(_kind, _scaled(0.9), negate=True, finish=lambda v: max(0.1, 1.0 + v))

# timm's RandAugment op lists (_RAND_TRANSFORMS, _RAND_INCREASING_TRANSFORMS; Cutout is random erasing)
RAND_OPS = ("AutoContrast", "Equalize", "Invert", "Rotate", "Posterize", "Solarize", "SolarizeAdd", "Color",
            "Contrast", "Brightness", "Sharpness", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel")
RAND_INCREASING_OPS = ("AutoContrast", "Equalize", "Invert", "Rotate", "PosterizeIncreasing", "SolarizeIncreasing",
                       "SolarizeAdd", "ColorIncreasing", "ContrastIncreasing", "BrightnessIncreasing",
                       "SharpnessIncreasing", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel")

# AutoAugment's ImageNet policies as timm has them: 25 sub-policies of two (op, probability, magnitude).
_V0 = """Equalize .8 1 ShearY .8 4|Color .4 9 Equalize .6 3|Color .4 1 Rotate .6 8|Solarize .8 3 Equalize .4 7|
Solarize .4 2 Solarize .6 2|Color .2 0 Equalize .8 8|Equalize .4 8 SolarizeAdd .8 3|ShearX .2 9 Rotate .6 8|
Color .6 1 Equalize 1 2|Invert .4 9 Rotate .6 0|Equalize 1 9 ShearY .6 3|Color .4 7 Equalize .6 0|
Posterize .4 6 AutoContrast .4 7|Solarize .6 8 Color .6 9|Solarize .2 4 Rotate .8 9|Rotate 1 7 TranslateYRel .8 9|
ShearX 0 0 Solarize .8 4|ShearY .8 0 Color .6 4|Color 1 0 Rotate .6 2|Equalize .8 4 Equalize 0 8|
Equalize 1 4 AutoContrast .6 2|ShearY .4 7 SolarizeAdd .6 7|Posterize .8 2 Solarize .6 10|
Solarize .6 8 Equalize .6 1|Color .8 6 Rotate .4 5"""
_ORIGINAL = """PosterizeOriginal .4 8 Rotate .6 9|Solarize .6 5 AutoContrast .6 5|Equalize .8 8 Equalize .6 3|
PosterizeOriginal .6 7 PosterizeOriginal .6 6|Equalize .4 7 Solarize .2 4|Equalize .4 4 Rotate .8 8|
Solarize .6 3 Equalize .6 7|PosterizeOriginal .8 5 Equalize 1 2|Rotate .2 3 Solarize .6 8|
Equalize .6 8 PosterizeOriginal .4 6|Rotate .8 8 Color .4 0|Rotate .4 9 Equalize .6 2|Equalize 0 7 Equalize .8 8|
Invert .6 4 Equalize 1 8|Color .6 4 Contrast 1 8|Rotate .8 8 Color 1 2|Color .8 8 Solarize .8 7|
Sharpness .4 7 Invert .6 8|ShearX .6 5 Equalize 1 9|Color .4 0 Equalize .6 3|Equalize .4 7 Solarize .2 4|
Solarize .6 5 AutoContrast .6 5|Invert .6 4 Equalize 1 8|Color .6 4 Contrast 1 8|Equalize .8 8 Equalize .6 3"""


def _policy(text: str) -> tuple[tuple[tuple[str, float, float], ...], ...]:
    subs = []
    for sub in text.replace("\n", "").split("|"):
        words = sub.split()
        subs.append(tuple((words[k], float(words[k + 1]), float(words[k + 2])) for k in range(0, len(words), 3)))
    return tuple(subs)


# timm's "r" variants: PosterizeIncreasing (the research implementations' posterize) in their place
POLICIES = {"v0": _policy(_V0), "original": _policy(_ORIGINAL),
            "v0r": _policy(_V0.replace("Posterize ", "PosterizeIncreasing ")),
            "originalr": _policy(_ORIGINAL.replace("PosterizeOriginal ", "PosterizeIncreasing "))}

# torchvision's TrivialAugmentWide (31 magnitude bins): kind -> (parameter at bin 0, at bin 30, signed).
# Enhance factors are 1 + the magnitude; posterize keeps 8 - round(bin / 5) bits; solarize's threshold
# falls from 255 to 0 (values >= it inverted, so the threshold is rounded up).
TRIVIAL_BINS = 31
TRIVIAL_OPS: tuple[tuple[str, float, float, bool], ...] = (
    ("identity", 0, 0, False), ("shear_x", 0, 0.99, True), ("shear_y", 0, 0.99, True),
    ("translate_x", 0, 32, True), ("translate_y", 0, 32, True), ("rotate", 0, 135, True),
    ("brightness", 0, 0.99, True), ("color", 0, 0.99, True), ("contrast", 0, 0.99, True),
    ("sharpness", 0, 0.99, True), ("posterize", 8, 2, False), ("solarize", 255, 0, False),
    ("auto_contrast", 0, 0, False), ("equalize", 0, 0, False),
)
ENHANCE = frozenset({"brightness", "color", "contrast", "sharpness"})


# Each kind's 31 magnitudes as torchvision draws them (torch.linspace in float32, whose rounding, as
# bin 15 of 0..32 being 15.999999, a float64 formula does not reproduce); posterize's bins are integers.
# Kinds without a magnitude (identity, auto_contrast, equalize) have 0 in every bin.
TRIVIAL_MAGNITUDES = {kind: BINS.get((float(first), float(last)), (0.0,) * TRIVIAL_BINS)
                      for kind, first, last, _ in TRIVIAL_OPS if kind != "posterize"}


def _rotation(value: float, width: int, height: int) -> Matrix:
    """PIL's Image.rotate as an output -> input map: counter-clockwise `value` degrees about the centre."""
    angle = -math.radians(value)
    a, b, d, e = math.cos(angle), math.sin(angle), -math.sin(angle), math.cos(angle)
    cx, cy = width / 2, height / 2
    return a, b, cx - a * cx - b * cy, d, e, cy - d * cx - e * cy


# PIL's Image.transform(AFFINE) matrices (output pixel -> input point, both in continuous coordinates
# where pixel i spans [i, i + 1]): DALI's warp_affine (inverse_map=True) uses the same convention.
AFFINE: dict[str, Callable[[float, int, int], Matrix]] = {
    "rotate": _rotation,
    "shear_x": lambda v, w, h: (1, v, 0, 0, 1, 0),
    "shear_y": lambda v, w, h: (1, 0, 0, v, 1, 0),
    "translate_x": lambda v, w, h: (1, 0, v, 0, 1, 0),
    "translate_y": lambda v, w, h: (1, 0, 0, 0, 1, v),
}
