"""Three draws against their reference rules (timm 1.0.31's mixup.py and auto_augment.py,
torchvision's TrivialAugmentWide), written out here from those sources: each differed before."""
import random

import numpy as np
import pytest
import torch

from datapipe.augment.ops import TIMM_OPS, TRIVIAL_OPS
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
    op = next(i for i, entry in enumerate(TRIVIAL_OPS) if entry[0] == kind)
    _, first, last, _ = TRIVIAL_OPS[op]
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
