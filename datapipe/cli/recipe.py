"""The recipe flags `datapipe train` and `datapipe preview` share: a preset (--recipe) and timm's train.py
flags that change one of its fields, parsed into a datapipe.Recipe, so what trains can be previewed
first. Imported by the CLI only."""
from __future__ import annotations

import argparse

from ..augment.recipe import PRESETS, Recipe, resolve_recipe


# `datapipe train` flags that change one field of the recipe, named as timm's train.py names them:
# flag -> (Recipe field, argparse keywords). --interpolation sets the train and the eval interpolation.
RECIPE_FLAGS: dict[str, tuple[str, dict]] = {
    "--aa": ("auto_augment", dict(metavar="POLICY", help="auto-augment in timm's grammar: rand-m9-mstd0.5-inc1, "
                                  "trivialaugment, original, v0; 'none': off")),
    "--mixup": ("mixup_alpha", dict(type=float, metavar="ALPHA", help="mixup's beta alpha (0: off)")),
    "--cutmix": ("cutmix_alpha", dict(type=float, metavar="ALPHA", help="cutmix's beta alpha (0: off)")),
    "--mixup-prob": ("mixup_prob", dict(type=float, metavar="P", help="probability that a batch is mixed")),
    "--mixup-switch-prob": ("switch_prob", dict(type=float, metavar="P",
                                                help="probability of cutmix rather than mixup when both are on")),
    "--mixup-mode": ("mix_mode", dict(choices=["batch", "elem"], help="one mix per batch or one per sample")),
    "--reprob": ("re_prob", dict(type=float, metavar="P", help="random erasing probability")),
    "--remode": ("re_mode", dict(choices=["const", "rand", "pixel"], help="random erasing fill")),
    "--recount": ("re_count", dict(type=int, metavar="N", help="random erasing boxes per image")),
    "--smoothing": ("label_smoothing", dict(type=float, metavar="S",
                                            help="the recipe's label smoothing, in its soft targets")),
    "--crop-pct": ("crop_pct", dict(type=float, metavar="PCT", help="eval centre crop: size / crop_pct resized first")),
    "--interpolation": ("eval_interpolation", dict(choices=["bilinear", "bicubic"],
                                                   help="resize filter of train and eval views")),
    "--train-interpolation": ("interpolation", dict(choices=["bilinear", "bicubic", "random"],
                                                    help="the train view's only (after --interpolation)")),
    "--hflip": ("hflip", dict(type=float, metavar="P", help="horizontal flip probability")),
    "--vflip": ("vflip", dict(type=float, metavar="P", help="vertical flip probability")),
    "--color-jitter": ("color_jitter", dict(type=float, metavar="J", help="brightness, contrast, saturation "
                                            "jitter (0: off; not applied with --aa, as in timm)")),
    "--grayscale-prob": ("grayscale_prob", dict(type=float, metavar="P", help="RandomGrayscale's probability")),
    "--aug-repeats": ("aug_repeats", dict(type=int, metavar="N", help="repeated augmentation: an epoch as long as "
                                          "the data holds 1/N of its records, each N times, each copy augmented "
                                          "apart (deit: 3, tv-v2: 4; 1: off)")),
    "--scale": ("scale", dict(type=float, nargs=2, metavar=("MIN", "MAX"), help="RandomResizedCrop's area share")),
    "--ratio": ("ratio", dict(type=float, nargs=2, metavar=("MIN", "MAX"), help="RandomResizedCrop's aspect ratio")),
}


RECIPE_GROUP = "augmentation recipe"
TRAIN_NOTE = "on --resume the checkpoint's recipe, which a resume cannot change"


def add_recipe_options(p: argparse.ArgumentParser, note: str = TRAIN_NOTE) -> None:
    """--recipe and every flag of RECIPE_FLAGS, in one group; a flag not given is absent from the
    namespace (`train_recipe` reads what was given). `note` ends the group's description."""
    group = p.add_argument_group(RECIPE_GROUP, f"a preset, and flags (timm's names) that change one field of it; {note}")
    group.add_argument("--recipe", metavar="PRESET", default=argparse.SUPPRESS,
                       help=f"one of {', '.join(sorted(PRESETS))}; default: default (crop + flip, integer labels)")
    for flag, (_, keywords) in RECIPE_FLAGS.items():
        group.add_argument(flag, default=argparse.SUPPRESS, **keywords)


def train_recipe(args: argparse.Namespace, saved: dict) -> Recipe | None:
    """--recipe (or, on --resume, the checkpoint's) with the recipe flags applied; None if none was given.
    `datapipe preview` reads its flags here too (`saved` empty); an unknown preset is a one-line ValueError."""
    from ..train.config import as_recipe

    changes = {field: getattr(args, flag[2:].replace("-", "_")) for flag, (field, _) in RECIPE_FLAGS.items()
               if hasattr(args, flag[2:].replace("-", "_"))}
    if "eval_interpolation" in changes:
        changes.setdefault("interpolation", changes["eval_interpolation"])
    if str(changes.get("auto_augment", "")).lower() == "none":
        changes["auto_augment"] = None
    if not changes and not hasattr(args, "recipe"):
        return None
    return resolve_recipe(as_recipe(getattr(args, "recipe", saved.get("recipe"))), **changes)
