"""The auto-augment policies as data: timm's RandAugment op lists, AutoAugment's ImageNet policies and
torchvision's TrivialAugmentWide op order, all by the names the op table (ops.py) declares."""
from __future__ import annotations

# timm's RandAugment op lists (_RAND_TRANSFORMS, _RAND_INCREASING_TRANSFORMS; Cutout is random erasing)
RAND_OPS = ("AutoContrast", "Equalize", "Invert", "Rotate", "Posterize", "Solarize", "SolarizeAdd", "Color",
            "Contrast", "Brightness", "Sharpness", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel")
RAND_INCREASING_OPS = ("AutoContrast", "Equalize", "Invert", "Rotate", "PosterizeIncreasing", "SolarizeIncreasing",
                       "SolarizeAdd", "ColorIncreasing", "ContrastIncreasing", "BrightnessIncreasing",
                       "SharpnessIncreasing", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel")

# timm's _AUGMIX_TRANSFORMS: AugMix's chains draw from these, each op applied (prob 1)
AUGMIX_OPS = ("AutoContrast", "ColorIncreasing", "ContrastIncreasing", "BrightnessIncreasing", "SharpnessIncreasing",
              "Equalize", "Rotate", "PosterizeIncreasing", "SolarizeIncreasing", "ShearX", "ShearY", "TranslateXRel",
              "TranslateYRel")
AUGMIX_TRANSLATE_PCT = 0.3  # timm's create_transform sets translate_pct 0.3 for AugMix (0.45 otherwise)

# timm's _RAND_CHOICE_WEIGHTS_0 (`-w0`): RandAugment's op choice weighted, n ops without replacement;
# by position in RAND_OPS (timm weighs the increasing list by the plain names at the same positions)
RAND_CHOICE_WEIGHTS = ({"Rotate": 0.3, "ShearX": 0.2, "ShearY": 0.2, "TranslateXRel": 0.1, "TranslateYRel": 0.1,
                        "Color": .025, "Sharpness": 0.025, "AutoContrast": 0.025, "Solarize": .005, "SolarizeAdd": .005,
                        "Contrast": .005, "Brightness": .005, "Equalize": .005, "Posterize": 0, "Invert": 0},)


def rand_weights(index: int | None) -> tuple[float, ...] | None:
    """The op choice weights of `-wN` by RAND_OPS position, summing to 1 (None: uniform, with replacement)."""
    if index is None:
        return None
    weights = [RAND_CHOICE_WEIGHTS[index][name] for name in RAND_OPS]
    return tuple(w / sum(weights) for w in weights)


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


# torchvision's TrivialAugmentWide op order (its magnitudes: each kind's `trivial` rule in ops.py)
TRIVIAL_ORDER = ("identity", "shear_x", "shear_y", "translate_x", "translate_y", "rotate", "brightness", "color",
                 "contrast", "sharpness", "posterize", "solarize", "auto_contrast", "equalize")
