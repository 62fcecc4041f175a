"""The op table: every pixel op a plan may hold, declared once, as DALI's `@augmentation` and timm's
NAME_TO_OP / LEVEL_TO_ARG declare theirs.

A declaration (`declare(Kind(...))`) holds everything about one op kind: its name and what its one
parameter means, the CPU kernel (a uint8 3 x H x W tensor, the parameter, the fill -> the same, as PIL
does it), the DALI kernel (a float HWC DataNode of whole levels, the parameter, the slot's affine
matrix, the graph's Context -> the same), the affine matrix of a geometric kind, timm's named ops of
the kind (each a magnitude -> parameter rule and whether it is randomly negated) and its
TrivialAugmentWide rule. The planner (plan.py) draws from the named ops and the rules; the appliers
(cpu.py, dali.py) and the DALI graph look the kernels up by kind id. Adding an op is one declaration.

Kernels reach their backend's helpers (augment.cpu, augment.dali) through `cpu()` and `dali()`,
imported when a kernel first runs, so this module (and the planner) loads neither torch nor DALI.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from .trivial_bins import BINS

Matrix = tuple[float, float, float, float, float, float]
LEVEL_MAX = 10.0  # timm's _LEVEL_DENOM
TRIVIAL_BINS = 31


@dataclass(frozen=True)
class Hparams:
    """What timm's op rules read beside the magnitude: the image size and the policy's translate_pct
    (0.45; AugMix's 0.3, as timm's create_transform sets it)."""

    size: int
    translate_pct: float = 0.45


@dataclass(frozen=True)
class OpSpec:
    """A named op (timm's): its kind, how a magnitude (0..10, timm's scale) becomes the kind's parameter,
    whether that parameter is negated with probability 1/2 before `finish` (timm's _randomly_negate)."""

    kind: str
    level: Callable[[float, "Hparams"], float] | None = None  # (magnitude, the policy's Hparams) -> parameter
    negate: bool = False
    finish: Callable[[float], float] | None = None


@dataclass(frozen=True)
class Trivial:
    """The kind in torchvision's TrivialAugmentWide: its 31 magnitudes (torch.linspace(first, last, 31)
    in float32, or `bins` given), `finish` before the random sign when `signed`, `offset` after it."""

    first: float = 0.0
    last: float = 0.0
    signed: bool = False
    finish: Callable[[float], float] | None = None
    offset: float = 0.0
    bins: tuple[float, ...] | None = None

    def magnitude(self, step: int) -> float:
        if self.bins is not None:
            return self.bins[step]
        return BINS[(float(self.first), float(self.last))][step] if self.first != self.last else 0.0


@dataclass(frozen=True)
class Jitter:
    """The kind in torchvision's ColorJitter: the range a strength s draws its factor from uniformly,
    and how that factor becomes the kind's parameter."""

    bounds: Callable[[float], tuple[float, float]]
    finish: Callable[[float], float] = float


FACTOR_JITTER = Jitter(lambda s: (max(0.0, 1 - s), 1 + s))  # brightness, contrast, saturation


@dataclass(frozen=True)
class Kind:
    """One op kind, everything about it in one place (the module docstring)."""

    name: str
    param: str
    cpu: Callable
    dali: Callable
    affine: Callable[[float, int, int], Matrix] | None = None  # output -> input map on a w x h image
    timm: dict[str, OpSpec] = field(default_factory=dict)
    trivial: Trivial | None = None
    jitter: Jitter | None = None


KINDS: list[str] = []  # names in id order: a plan stores the id
KIND_ID: dict[str, int] = {}
TABLE: dict[str, Kind] = {}
TIMM_OPS: dict[str, OpSpec] = {}


def declare(kind: Kind) -> Kind:
    """Register `kind` (its id: the next free one) and its named ops; a name taken is a ValueError."""
    if kind.name in TABLE or set(kind.timm) & set(TIMM_OPS):
        raise ValueError(f"op kind {kind.name!r} or one of its names {sorted(kind.timm)} is declared already")
    KIND_ID[kind.name] = len(KINDS)
    KINDS.append(kind.name)
    TABLE[kind.name] = kind
    TIMM_OPS.update(kind.timm)
    return kind


def kind_of(kind_id: float) -> Kind:
    return TABLE[KINDS[int(kind_id)]]


def cpu():
    from . import cpu_kernels
    return cpu_kernels


def dali():
    from . import dali_kernels
    return dali_kernels


def _named(kind: str, **rules: tuple) -> dict[str, OpSpec]:
    return {name: OpSpec(kind, *rule) for name, rule in rules.items()}


def _scaled(top: float) -> Callable[[float, Hparams], float]:
    return lambda m, hp: m / LEVEL_MAX * top


def _posterize(m: float, hp: Hparams) -> float:
    return int(m / LEVEL_MAX * 4)


def _solarize(m: float, hp: Hparams) -> float:
    return min(256, int(m / LEVEL_MAX * 256))  # timm clamps past magnitude 10 (mmax > 10)


def _enhance_named(name: str, kind: str) -> dict[str, OpSpec]:
    """timm's enhance op (factor 0.1..1.9 over magnitude 0..10) and its Increasing variant (1 +- 0.9 m/10)."""
    return _named(kind, **{name: (lambda m, hp: m / LEVEL_MAX * 1.8 + 0.1,),
                           f"{name}Increasing": (_scaled(0.9), True, lambda v: max(0.1, 1.0 + v))})


ENHANCE_TRIVIAL = Trivial(0, 0.99, signed=True, offset=1.0)  # torchvision: factor 1 +- the magnitude


# ---- the point ops: a lookup table on the CPU, arithmetic in DALI --------------------------------

declare(Kind("identity", "-", lambda image, value, fill: image, lambda x, value, matrix, ctx: x,
             trivial=Trivial()))
declare(Kind("auto_contrast", "- (PIL ImageOps.autocontrast, per channel)",
             lambda image, value, fill: cpu().auto_contrast(image),
             lambda x, value, matrix, ctx: dali().auto_contrast(x),
             timm=_named("auto_contrast", AutoContrast=()), trivial=Trivial()))
declare(Kind("equalize", "- (PIL ImageOps.equalize, per channel)",
             lambda image, value, fill: cpu().equalize(image), lambda x, value, matrix, ctx: dali().equalize(x),
             timm=_named("equalize", Equalize=()), trivial=Trivial()))
declare(Kind("invert", "-", lambda image, value, fill: 255 - image, lambda x, value, matrix, ctx: 255.0 - x,
             timm=_named("invert", Invert=())))


def _posterize_dali(x, value, matrix, ctx):
    dmath = dali().modules()[1]
    step = dmath.pow(2.0, 8.0 - dmath.clamp(dmath.floor(ctx.scalar(value)), 0.0, 8.0))
    return dmath.floor(x / step) * step


declare(Kind("posterize", "bits kept, 0..8 (0: black, as timm's level 0 asks)", lambda image, value, fill: cpu().posterize(image, value), _posterize_dali,
             timm=_named("posterize", Posterize=(_posterize,), PosterizeIncreasing=(lambda m, s: 4 - _posterize(m, s),),
                         PosterizeOriginal=(lambda m, s: _posterize(m, s) + 4,)),
             trivial=Trivial(bins=tuple(8 - round(step / 5) for step in range(TRIVIAL_BINS)))))
declare(Kind("solarize", "threshold: values >= it are inverted (above 255, timm's level 0: none)",
             lambda image, value, fill: cpu().solarize(image, value),
             lambda x, value, matrix, ctx: x + (x >= ctx.scalar(value)) * (255.0 - 2.0 * x),
             timm=_named("solarize", Solarize=(_solarize,), SolarizeIncreasing=(lambda m, s: 256 - _solarize(m, s),)),
             trivial=Trivial(255, 0, finish=math.ceil)))


def _solarize_add_dali(x, value, matrix, ctx):
    dmath = dali().modules()[1]
    return x + (x < 128.0) * (dmath.clamp(x + dmath.floor(ctx.scalar(value)), 0.0, 255.0) - x)


declare(Kind("solarize_add", "added to values < 128, saturating",
             lambda image, value, fill: cpu().solarize_add(image, value),
             _solarize_add_dali,
             timm=_named("solarize_add", SolarizeAdd=(lambda m, s: min(128, int(m / LEVEL_MAX * 110)),))))  # timm's clamp

# ---- the blends: PIL's ImageEnhance, truncated as PIL stores them ------------------------------

declare(Kind("color", "saturation factor (ImageEnhance.Color: blend with the L image)",
             lambda image, value, fill: cpu().color(image, value),
             lambda x, value, matrix, ctx: dali().blend(dali().gray(x), x, ctx.scalar(value)),
             timm=_enhance_named("Color", "color"), trivial=ENHANCE_TRIVIAL, jitter=FACTOR_JITTER))
declare(Kind("contrast", "factor (ImageEnhance.Contrast: blend with the L image's mean)",
             lambda image, value, fill: cpu().contrast(image, value),
             lambda x, value, matrix, ctx: dali().blend(dali().gray_mean(x), x, ctx.scalar(value)),
             timm=_enhance_named("Contrast", "contrast"), trivial=ENHANCE_TRIVIAL, jitter=FACTOR_JITTER))
declare(Kind("brightness", "factor (ImageEnhance.Brightness: blend with black)",
             lambda image, value, fill: cpu().brightness(image, value),
             lambda x, value, matrix, ctx: dali().levels(ctx.scalar(value) * x),
             timm=_enhance_named("Brightness", "brightness"), trivial=ENHANCE_TRIVIAL, jitter=FACTOR_JITTER))
declare(Kind("sharpness", "factor (ImageEnhance.Sharpness: blend with PIL's SMOOTH filter, border kept)",
             lambda image, value, fill: cpu().sharpness(image, value),
             lambda x, value, matrix, ctx: dali().sharpness(x, ctx.scalar(value)),
             timm=_enhance_named("Sharpness", "sharpness"), trivial=ENHANCE_TRIVIAL))

declare(Kind("hue", "the shift of PIL's 8-bit hue channel, 0..255 (torchvision's adjust_hue: int(factor * 255), wrapped)",
             lambda image, value, fill: cpu().hue(image, int(value)),
             lambda x, value, matrix, ctx: dali().hue(x, ctx.scalar(value)),
             jitter=Jitter(lambda s: (-s, s), lambda factor: float(int(factor * 255) % 256))))

# ---- the geometric ops: PIL's Image.transform(AFFINE) matrices (output pixel -> input point, both in
# continuous coordinates where pixel i spans [i, i + 1]; DALI's warp_affine, inverse_map=True, agrees)


def _rotation(value: float, width: int, height: int) -> Matrix:
    """PIL's Image.rotate as an output -> input map: counter-clockwise `value` degrees about the centre."""
    angle = -math.radians(value)
    a, b, d, e = math.cos(angle), math.sin(angle), -math.sin(angle), math.cos(angle)
    cx, cy = width / 2, height / 2
    return a, b, cx - a * cx - b * cy, d, e, cy - d * cx - e * cy


def _warp_cpu(image, value, fill, matrix: Callable[[float, int, int], Matrix]):
    _, h, w = image.shape
    return cpu().affine(image, matrix(value, w, h), fill)


def _geometric(name: str, param: str, matrix: Callable[[float, int, int], Matrix], timm: dict, trivial: Trivial) -> Kind:
    return declare(Kind(name, param, lambda image, value, fill: _warp_cpu(image, value, fill, matrix),
                        lambda x, value, m, ctx: dali().affine(x, m, ctx), matrix, timm, trivial))


_geometric("rotate", "degrees, counter-clockwise about the centre (PIL Image.rotate)", _rotation,
           _named("rotate", Rotate=(_scaled(30.0), True)), Trivial(0, 135, signed=True))
_geometric("shear_x", "factor: input x = x + factor * y (about the top-left corner)", lambda v, w, h: (1, v, 0, 0, 1, 0),
           _named("shear_x", ShearX=(_scaled(0.3), True)), Trivial(0, 0.99, signed=True))
_geometric("shear_y", "factor: input y = y + factor * x", lambda v, w, h: (1, 0, 0, v, 1, 0),
           _named("shear_y", ShearY=(_scaled(0.3), True)), Trivial(0, 0.99, signed=True))
_geometric("translate_x", "pixels: input x = x + pixels", lambda v, w, h: (1, 0, v, 0, 1, 0),
           _named("translate_x", TranslateXRel=(lambda m, hp: m / LEVEL_MAX * hp.translate_pct * hp.size, True)),
           Trivial(0, 32, signed=True, finish=int))  # torchvision shifts by int(magnitude) pixels
_geometric("translate_y", "pixels: input y = y + pixels", lambda v, w, h: (1, 0, 0, 0, 1, v),
           _named("translate_y", TranslateYRel=(lambda m, hp: m / LEVEL_MAX * hp.translate_pct * hp.size, True)),
           Trivial(0, 32, signed=True, finish=int))

# ---- the recipe's own pixel ops -----------------------------------------------------------------

declare(Kind("vflip", "- (a vertical flip)", lambda image, value, fill: image.flip(-2),
             lambda x, value, matrix, ctx: dali().modules()[0].flip(x, horizontal=0, vertical=1)))
declare(Kind("grayscale", "- (the L image in all three channels)", lambda image, value, fill: cpu().grayscale(image),
             lambda x, value, matrix, ctx: dali().grayscale(x)))
