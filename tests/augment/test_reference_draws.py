"""Three draws against their reference rules (timm 1.0.31's mixup.py and auto_augment.py,
torchvision's TrivialAugmentWide), written out here from those sources: each differed before."""
import random

import numpy as np
import pytest
import torch

from datapipe.augment.ops import TABLE, TIMM_OPS
from datapipe.augment.policies import TRIVIAL_ORDER
from datapipe.augment.batch_plan import _cut_box
from datapipe.augment.plan import _trivial


def timm_rand_bbox(h: int, w: int, lam: float, cy: int, cx: int) -> tuple[int, int, int, int]:
    """timm 1.0.31 rand_bbox at a given centre (margin 0): the far side gets the odd pixel."""
    ratio = np.sqrt(1 - lam)
    cut_h, cut_w = int(h * ratio), int(w * ratio)
    return (int(np.clip(cy - cut_h // 2, 0, h)), int(np.clip(cy + (cut_h + 1) // 2, 0, h)),
            int(np.clip(cx - cut_w // 2, 0, w)), int(np.clip(cx + (cut_w + 1) // 2, 0, w)))


@pytest.mark.parametrize("h,w", [(224, 224), (160, 192), (7, 9)])
def test_the_cutmix_box_is_timms_box_and_its_lam_the_area_kept(h, w):
    odd = 0
    for seed in range(300):
        lam = float(np.random.default_rng(seed + 10_000).uniform(0.05, 0.95))
        centre = np.random.default_rng(seed)
        cy, cx = int(centre.integers(0, h)), int(centre.integers(0, w))  # the draws _cut_box makes, in order
        *box, kept = _cut_box(np.random.default_rng(seed), lam, h, w)
        assert tuple(box) == timm_rand_bbox(h, w, lam, cy, cx)
        top, bottom, left, right = box
        assert kept == pytest.approx(1 - (bottom - top) * (right - left) / (h * w))
        odd += int(h * np.sqrt(1 - lam)) % 2
    assert odd > 50  # odd box sides, where the old box was a pixel short, were exercised


@pytest.mark.parametrize("magnitude", [5, 10, 12, 13, 15, 30])
def test_solarize_parameters_are_clamped_as_timm_past_magnitude_10(magnitude):
    assert TIMM_OPS["SolarizeAdd"].level(magnitude, 224) == min(128, int(magnitude / 10 * 110))
    assert TIMM_OPS["Solarize"].level(magnitude, 224) == min(256, int(magnitude / 10 * 256))
    assert TIMM_OPS["SolarizeIncreasing"].level(magnitude, 224) == 256 - min(256, int(magnitude / 10 * 256))


class Scripted(random.Random):
    """A random.Random whose randrange answers are given (the op, then the bin); random() as seeded."""

    def __init__(self, answers):
        super().__init__(0)
        self.answers = list(answers)

    def randrange(self, *args, **kwargs):
        return self.answers.pop(0)


@pytest.mark.parametrize("kind", ["translate_x", "translate_y", "shear_x", "rotate", "brightness", "solarize"])
def test_trivial_augment_magnitudes_are_torchvisions_float32_bins(kind):
    """torchvision: magnitudes = torch.linspace(first, last, 31) (float32); translate shifts by
    int(magnitude) px: bin 15 of 0..32 is 15.999999, a 15 px shift (16 before)."""
    op = TRIVIAL_ORDER.index(kind)
    first, last = TABLE[kind].trivial.first, TABLE[kind].trivial.last
    bins = torch.linspace(float(first), float(last), 31).tolist()
    for step in range(31):
        _, value = _trivial(Scripted([op, step]))
        expected = {"translate_x": int(bins[step]), "translate_y": int(bins[step]),
                    "solarize": float(np.ceil(bins[step]))}.get(kind, bins[step])
        if kind == "brightness":
            expected = 1.0 + bins[step]
        assert abs(value) == pytest.approx(abs(expected), abs=0) or value == pytest.approx(2 - expected, abs=0), step
    if kind.startswith("translate"):
        assert abs(_trivial(Scripted([op, 15]))[1]) == 15


def test_the_written_out_bins_are_torchs_linspace():
    from datapipe.augment.trivial_bins import BINS

    for (first, last), bins in BINS.items():
        assert list(bins) == torch.linspace(first, last, 31).tolist()


def test_weighted_randaugment_draws_timms_w0_without_replacement():
    """`-w0`: timm's _RAND_CHOICE_WEIGHTS_0 over the op list, n ops without replacement (np.random.choice
    replace=False): never Posterize or Invert, never one op twice, frequencies as the weights."""
    from collections import Counter

    from datapipe.augment.plan import _rand_choice
    from datapipe.augment.recipe import parse_auto_augment
    from datapipe.augment.policies import RAND_CHOICE_WEIGHTS

    augment = parse_auto_augment("rand-m9-n2-w0")
    draws = [_rand_choice(augment, random.Random(seed)) for seed in range(20_000)]
    assert all(len(set(names)) == 2 for names in draws)
    first = Counter(names[0] for names in draws)
    weights = RAND_CHOICE_WEIGHTS[0]
    assert set(first) == {name for name, w in weights.items() if w > 0}
    for name, w in weights.items():
        assert first[name] / len(draws) == pytest.approx(w / sum(weights.values()), abs=0.01), name
    reference = np.random.default_rng(0)
    names = list(weights)
    p = np.array([weights[n] for n in names]) / sum(weights.values())
    pairs = Counter(tuple(reference.choice(names, 2, replace=False, p=p)) for _ in range(20_000))
    ours = Counter(tuple(d) for d in draws)
    assert ours[("Rotate", "ShearX")] / 20_000 == pytest.approx(pairs[("Rotate", "ShearX")] / 20_000, abs=0.01)
    with pytest.raises(ValueError, match="one set of op weights, w0"):
        parse_auto_augment("rand-m9-w1")


def test_hue_jitter_shifts_as_torchvisions_adjust_hue():
    """The 4th color_jitter value: factor uniform in [-h, h], PIL's hue byte shifted by
    np.array(factor * 255).astype(np.uint8) (int(factor * 255) wrapped); 0 keeps the 3-factor draws."""
    from datapipe.augment import Recipe, plan_sample
    from datapipe.augment.ops import KIND_ID

    with_hue, without = Recipe(color_jitter=(0.4, 0.4, 0.4, 0.25)), Recipe(color_jitter=(0.4, 0.4, 0.4, 0))
    assert without == Recipe(color_jitter=0.4)
    shifts = [v for i in range(2000) for k, v in plan_sample(with_hue, 0, 0, i, 64, 90, 80).ops if k == KIND_ID["hue"]]
    assert len(shifts) == 2000 and all(v == int(v) and 0 <= v <= 255 for v in shifts)
    assert max(v for v in shifts if v < 128) == 63 and min(v for v in shifts if v >= 128) == 256 - 63
    for factor in (-0.25, -0.1, 0.0, 0.13, 0.25):
        assert int(factor * 255) % 256 == int(np.array(factor * 255).astype(np.int64).astype(np.uint8))
    with pytest.raises(ValueError, match="hue"):
        Recipe(color_jitter=(0.4, 0.4, 0.4, 0.6))


def test_the_hue_kernel_is_pils_hsv_shift():
    from PIL import Image

    from datapipe.augment.cpu_kernels import hue

    pixels = np.random.default_rng(1).integers(0, 256, (16, 16, 3), dtype=np.uint8)
    h, s, v = Image.fromarray(pixels).convert("HSV").split()
    shifted = Image.fromarray((np.array(h) + np.uint8(200)).astype(np.uint8), "L")
    expected = np.array(Image.merge("HSV", (shifted, s, v)).convert("RGB"))
    out = hue(torch.from_numpy(pixels).permute(2, 0, 1).contiguous(), 200)
    assert np.array_equal(out.permute(1, 2, 0).numpy(), expected) and not np.array_equal(expected, pixels)


def timm_augmix_mix(image: np.ndarray, chains: list[np.ndarray], weights, m) -> np.ndarray:
    """timm 1.0.31 AugMixAugment._apply_basic's arithmetic, given each chain's augmented image (HWC uint8)."""
    from PIL import Image

    mixed = np.zeros(image.shape, dtype=np.float32)
    for mw, augmented in zip(np.float32(weights), chains):
        mixed += mw * np.asarray(augmented, dtype=np.float32)
    np.clip(mixed, 0, 255., out=mixed)
    return np.asarray(Image.blend(Image.fromarray(image), Image.fromarray(mixed.astype(np.uint8)), np.float32(m)))


def test_augmix_mixes_as_timms_apply_basic():
    """The CPU applier's mix of the chains (float32 sum, clip, truncation, PIL's blend) is timm's,
    bit for bit, on planned mixes of a photo-like image."""
    from datapipe.augment import Recipe, plan_sample
    from datapipe.augment.cpu import apply_ops, augmix

    rng = np.random.default_rng(3)
    image = np.clip(np.linspace(0, 255, 48)[None, :, None] + rng.normal(0, 30, (40, 48, 3)), 0, 255).astype(np.uint8)
    tensor = torch.from_numpy(image).permute(2, 0, 1).contiguous()
    recipe = Recipe(auto_augment="augmix-m5-w3")
    for key in range(40):
        mix = plan_sample(recipe, 0, 0, key, 48, 60, 50).augmix
        chains = [apply_ops(tensor, chain, fill=(124, 116, 104)).permute(1, 2, 0).numpy() for chain in mix.chains]
        expected = timm_augmix_mix(image, chains, mix.weights, mix.m)
        assert np.array_equal(augmix(tensor, mix, (124, 116, 104)).permute(1, 2, 0).numpy(), expected), key


def test_augmix_draws_as_timms_augmix_m5_w4_d2():
    """Dirichlet(1) weights over the chains (float32, summing to 1), Beta(1, 1) blends, the chains'
    depth (given, or 1 to 3 uniformly), ops with replacement from timm's _AUGMIX_TRANSFORMS with
    magnitudes uniform in 0..m (mstd inf), translations at timm's AugMix translate_pct 0.3."""
    from collections import Counter

    from datapipe.augment import Recipe, plan_sample
    from datapipe.augment.ops import KINDS
    from datapipe.augment.policies import AUGMIX_OPS

    plans = [plan_sample(Recipe(auto_augment="augmix-m5-w4-d2"), 0, 0, i, 100, 120, 90) for i in range(3000)]
    assert all(p.augmix is not None and len(p.augmix.chains) == 4 and len(p.augmix.weights) == 4 for p in plans)
    assert all(abs(sum(p.augmix.weights) - 1) < 1e-6 and np.float32(p.augmix.m) == p.augmix.m for p in plans)
    first = np.array([p.augmix.weights[0] for p in plans])
    assert first.mean() == pytest.approx(0.25, abs=0.01) and first.var() == pytest.approx(3 / 80, rel=0.1)  # Dir(1)
    assert np.mean([p.augmix.m for p in plans]) == pytest.approx(0.5, abs=0.02)
    kinds = Counter(KINDS[int(k)] for p in plans for chain in p.augmix.chains for k, _ in chain)
    assert set(kinds) == {TIMM_OPS[name].kind for name in AUGMIX_OPS}
    shifts = [abs(v) for p in plans for chain in p.augmix.chains for k, v in chain if KINDS[int(k)] == "translate_x"]
    assert max(shifts) <= 5 / 10 * 0.3 * 100 and max(shifts) > 0.9 * 15  # uniform in 0..m, translate_pct 0.3
    depths = Counter(len(chain) for p in [plan_sample(Recipe(auto_augment="augmix"), 0, 0, i, 100, 120, 90)
                                          for i in range(900)] for chain in p.augmix.chains)
    assert set(depths) == {1, 2, 3} and min(depths.values()) > 800  # 1 to 3 uniformly (no identity in the list)


def test_augmix_small_alphas_are_refused_or_drawn_without_a_zero_division():
    from datapipe.augment import Recipe, plan_sample

    with pytest.raises(ValueError, match="a must be"):
        Recipe(auto_augment="augmix-w1-a0.001")
    for key in range(2000):
        mix = plan_sample(Recipe(auto_augment="augmix-w2-a0.05"), 0, 0, key, 32, 40, 30).augmix
        assert abs(sum(mix.weights) - 1) < 1e-6 or sum(mix.weights) == 0
