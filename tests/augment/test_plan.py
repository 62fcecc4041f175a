"""The planner: the default recipe's plans are the loader's historical views; every recipe's plans
are a pure function of (recipe, seed, epoch, record, size, width, height); the draws follow timm's
and torchvision's rules (which ops, how many, which magnitudes)."""
from __future__ import annotations

import collections

import pytest

from datapipe.augment import PRESETS, Recipe, parse_auto_augment, plan_erase, plan_sample, resolve_recipe
from datapipe.augment.ops import KIND_ID, KINDS, TIMM_OPS
from datapipe.augment.policies import RAND_INCREASING_OPS
from datapipe.augment.plan import SamplePlan, fill_color
from datapipe.augment.slots import ops_row
from datapipe.augment.plan import random_resized_crop, sample_rng
from datapipe.image.geometry import Crop


def kinds_of(plans):
    return collections.Counter(KINDS[int(k)] for p in plans for k, _ in p.ops)


def test_the_default_recipe_plans_the_historical_views():
    plan = plan_sample(Recipe(), 3, 2, 17, 224, 640, 480)
    assert plan == SamplePlan(224, Crop(49, 18, 449, 345, True), "bilinear", 0.875, (), plan.transform_seed)
    assert plan_sample(None, 3, 2, 17, 224, 640, 480) == plan_sample(Recipe(), 3, 2, 17, 224, 640, 480)
    for index in range(200):
        expected = random_resized_crop(500, 375, sample_rng(0, 4, index))
        assert plan_sample(PRESETS["default"], 0, 4, index, 224, 500, 375).crop == expected
    assert plan_sample(Recipe(), 0, 0, 0, 224, 500, 375, train=False) == SamplePlan(224, None, "bilinear", 0.875)


def test_a_plan_is_a_function_of_seed_epoch_and_record():
    deit = PRESETS["deit"]
    plans = [plan_sample(deit, 0, 1, i, 224, 500, 375) for i in range(50)]
    assert plans == [plan_sample(deit, 0, 1, i, 224, 500, 375) for i in range(50)]
    assert plans != [plan_sample(deit, 0, 2, i, 224, 500, 375) for i in range(50)]
    assert plans != [plan_sample(deit, 1, 1, i, 224, 500, 375) for i in range(50)]
    assert len(set(plans)) == 50


def test_randaugment_draws_as_timm_rand_m9_mstd0_5_inc1():
    """Two ops chosen with replacement from the increasing list, each applied with p=0.5, magnitude
    gauss(9, 0.5) clipped to 0..10: on average one op an image, every op of the list drawn."""
    plans = [plan_sample(PRESETS["deit"], 0, 0, i, 224, 500, 375) for i in range(3000)]
    counts = [len(p.ops) for p in plans]
    assert 0.93 < sum(counts) / len(counts) < 1.07 and max(counts) == 2
    assert set(kinds_of(plans)) == {TIMM_OPS[name].kind for name in RAND_INCREASING_OPS}
    for p in plans:
        for kind, value in p.ops:
            name = KINDS[int(kind)]
            if name == "rotate":
                assert 18 <= abs(value) <= 30  # 30 * m / 10, m ~ N(9, 0.5) clipped at 10 (m >= 6: 6 sigma)
            elif name in ("shear_x", "shear_y"):
                assert 0.18 <= abs(value) <= 0.3
            elif name in ("translate_x", "translate_y"):
                assert 0.27 * 224 <= abs(value) <= 0.45 * 224
            elif name in ("color", "contrast", "brightness", "sharpness"):
                assert 0.1 <= value <= 1.9 and abs(value - 1) >= 0.54
            elif name == "posterize":
                assert value in (0, 1, 2)  # 4 - int(m * 0.4): bits kept fall as m rises
    signs = [value > 0 for p in plans for kind, value in p.ops if KINDS[int(kind)] == "rotate"]
    assert 0.4 < sum(signs) / len(signs) < 0.6


def test_fixed_magnitude_without_mstd():
    plans = [plan_sample(Recipe(auto_augment="rand-m9-n1"), 0, 0, i, 100, 500, 375) for i in range(400)]
    rotations = {round(abs(v), 6) for p in plans for k, v in p.ops if KINDS[int(k)] == "rotate"}
    assert rotations == {27.0}
    assert max(len(p.ops) for p in plans) == 1


def test_trivial_augment_wide_draws_one_op_of_31_bins():
    plans = [plan_sample(PRESETS["tv-v2"], 0, 0, i, 176, 500, 375) for i in range(3000)]
    assert max(len(p.ops) for p in plans) == 1
    assert 0.9 < sum(len(p.ops) for p in plans) / 3000 < 0.96  # identity: 1 op of 14
    bits = {v for p in plans for k, v in p.ops if KINDS[int(k)] == "posterize"}
    assert bits == {2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0}
    rotations = [abs(v) for p in plans for k, v in p.ops if KINDS[int(k)] == "rotate"]
    assert max(rotations) <= 135 and min(rotations) == 0
    shifts = {v for p in plans for k, v in p.ops if KINDS[int(k)] in ("translate_x", "translate_y")}
    assert all(v == int(v) for v in shifts) and max(shifts) == 32  # torchvision: int(magnitude) pixels
    assert fill_color(PRESETS["tv-v2"]) == (0, 0, 0) and fill_color(PRESETS["deit"]) == (124, 116, 104)


def test_autoaugment_policies_apply_their_sub_policies():
    plans = [plan_sample(Recipe(auto_augment="original"), 0, 0, i, 224, 500, 375) for i in range(2000)]
    found = set(kinds_of(plans))
    assert found <= {"posterize", "rotate", "solarize", "auto_contrast", "equalize", "color", "invert",
                     "contrast", "sharpness", "shear_x"} and {"equalize", "rotate", "posterize"} <= found
    bits = {v for p in plans for k, v in p.ops if KINDS[int(k)] == "posterize"}
    assert bits <= {6.0, 7.0}  # PosterizeOriginal at magnitudes 5..8: int(m * 0.4) + 4
    research = [plan_sample(Recipe(auto_augment="originalr"), 0, 0, i, 224, 500, 375) for i in range(2000)]
    assert {v for p in research for k, v in p.ops if KINDS[int(k)] == "posterize"} <= {1.0, 2.0}  # 4 - int(m * 0.4)


def test_colour_jitter_in_a_random_order_and_off_under_auto_augment():
    recipe = Recipe(color_jitter=0.4, grayscale_prob=0.2, vflip=0.5)
    plans = [plan_sample(recipe, 0, 0, i, 64, 500, 375) for i in range(1000)]
    orders = collections.Counter(tuple(KINDS[int(k)] for k, _ in p.ops if KINDS[int(k)] in
                                       ("brightness", "contrast", "color")) for p in plans)
    assert len(orders) == 6
    assert all(0.6 <= v <= 1.4 for p in plans for k, v in p.ops if KINDS[int(k)] in ("brightness", "contrast", "color"))
    counts = kinds_of(plans)
    assert 150 < counts["grayscale"] < 250 and 420 < counts["vflip"] < 580
    assert Recipe(color_jitter=0.4, auto_augment="rand-m9").jitter is None


def test_erase_plans_follow_timm_random_erasing():
    recipe = Recipe(re_prob=0.25, re_mode="pixel")
    plans = [plan_erase(recipe, 0, 0, i, 224) for i in range(2000)]
    erased = [boxes for boxes, _ in plans if boxes]
    assert 0.2 < len(erased) / 2000 < 0.3
    for (top, left, h, w), in erased:
        assert 0 <= top and top + h <= 224 and 0 <= left and left + w <= 224
        assert 0.015 * 224 * 224 <= h * w <= 0.34 * 224 * 224
    assert plans == [plan_erase(recipe, 0, 0, i, 224) for i in range(2000)]
    assert plan_erase(Recipe(), 0, 0, 5, 224) == ((), 0)
    counts = collections.Counter(len(plan_erase(Recipe(re_prob=1.0, re_count=3), 0, 0, i, 224)[0]) for i in range(600))
    assert set(counts) == {1, 2, 3} and min(counts.values()) > 150  # timm: randint(1, re_count) boxes


def test_ops_row_is_fixed_width():
    row = ops_row(((KIND_ID["rotate"], 12.5), (KIND_ID["invert"], 0.0)))
    assert len(row) == 16 and row[:4] == [KIND_ID["rotate"], 12.5, KIND_ID["invert"], 0.0] and row[4:] == [0.0] * 12


@pytest.mark.parametrize("text,message", [
    ("rand-x9", "cannot read 'x9'"), ("augmix-m5-b1", "blended mode is not carried"),
    ("autoaug", "unknown policy 'autoaug'"), ("original-m9", "cannot read 'm9'"),
])
def test_bad_auto_augment_strings_are_named(text, message):
    with pytest.raises(ValueError, match=message):
        parse_auto_augment(text)


def test_auto_augment_grammar():
    assert parse_auto_augment("rand-m9-mstd0.5-inc1") == parse_auto_augment("rand-inc1-mstd0.5-m9")
    spec = parse_auto_augment("rand-m7-n3-mstd101-mmax12-inc0")
    assert (spec.magnitude, spec.num_ops, spec.magnitude_std, spec.magnitude_max, spec.increasing) == \
        (7, 3, float("inf"), 12, False)
    assert parse_auto_augment("ta_wide").policy == "trivialaugment"


@pytest.mark.parametrize("fields,message", [
    (dict(scale=(0.5, 0.1)), r"scale must be a pair \(low, high\) of finite numbers with 0 < low <= high <= 1"), (dict(interpolation="lanczos"), "interpolation must be one of"),
    (dict(hflip=1.5), "hflip must be a probability"), (dict(hflip="0.5"), "hflip must be a probability"),
    (dict(re_count=1.5), r"re_count must be within 1..32 \(an int"), (dict(aug_repeats=0), "aug_repeats must be within 1..16"),
    (dict(mean=0.5), "mean must be 3 finite numbers"), (dict(std=(0.2, 0.2, 0)), r"std must be 3 finite numbers, each within \[0.0001, 1\]"),
    (dict(crop_pct="1"), "crop_pct must be a finite number"), (dict(auto_augment="rand-m9-n5"), "n must be within 1..4"), (dict(re_mode="noise"), "re_mode must be one of"),
    (dict(color_jitter=(0.4, 0.4, 0.4, 0.7)), "hue must be"), (dict(crop_pct=0), "crop_pct"),
    (dict(mix_mode="pair"), "'pair' is not supported"),
])
def test_bad_recipe_fields_are_named(fields, message):
    with pytest.raises(ValueError, match=message):
        Recipe(**fields)


def test_presets_and_overrides():
    assert resolve_recipe("deit").auto_augment == "rand-m9-mstd0.5-inc1"
    assert resolve_recipe("deit", re_prob=0.0).re_prob == 0.0
    assert resolve_recipe(None) == Recipe()
    with pytest.raises(ValueError, match="one of"):
        resolve_recipe("deit3")
    with pytest.raises(ValueError, match="unknown recipe field"):
        resolve_recipe("deit", re_probability=0.1)
    for recipe in PRESETS.values():
        assert Recipe.from_dict(recipe.to_dict()) == recipe


def test_mix_plans_follow_timm_mixup_rates():
    """mixup_prob of batches mixed; among them switch_prob cutmix (a box, lam = the area kept)."""
    from datapipe.augment.batch_plan import plan_mix

    recipe = Recipe(mixup_alpha=0.8, cutmix_alpha=1.0, mixup_prob=0.6, switch_prob=0.25)
    plans = [plan_mix(recipe, 0, 0, 64 * k, 0, 8, 32, 32) for k in range(2000)]
    mixed = [p for p in plans if p.lams[0] != 1.0]
    cut = [p for p in mixed if p.boxes[0] is not None]
    assert 0.55 < len(mixed) / 2000 < 0.65 and 0.2 < len(cut) / len(mixed) < 0.3
    for p in cut:
        top, bottom, left, right = p.boxes[0]
        assert abs(p.lams[0] - (1 - (bottom - top) * (right - left) / 1024)) < 1e-6
        assert len(set(p.boxes)) == 1 and len(set(p.lams.tolist())) == 1  # batch mode: one for all
    elem = plan_mix(Recipe(mixup_alpha=1.0, mix_mode="elem"), 0, 0, 0, 0, 8, 32, 32)
    assert len(set(elem.lams.tolist())) == 8
    assert [plan_mix(recipe, 0, 0, 64 * k, 1, 8, 32, 32).lams[0] for k in range(20)] != [p.lams[0] for p in plans[:20]]
