"""The batch stage: timm's Mixup (batch and elem modes, cutmix with the lam correction) and label
smoothing as soft targets, random erasing by the planned boxes; seeded by position, not by a global
generator."""
from __future__ import annotations

import torch
import pytest

from datapipe.augment import Recipe, plan_erase
from datapipe.augment.batch import BatchStage


def batch(n=8, size=16, classes=5):
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 3, size, size, generator=g), torch.arange(n) % classes, torch.arange(100, 100 + n)


def run(recipe, *, classes=5, position=0, epoch=0, rank=0, normalized=True, data=None):
    images, labels, indices = data or batch(classes=classes)
    stage = BatchStage(recipe, seed=7, num_classes=classes, normalized=normalized)
    return images, labels, stage(images.clone(), labels, indices, epoch=epoch, position=position, rank=rank)


def test_label_smoothing_alone_gives_timm_soft_targets():
    _, labels, (_, targets) = run(Recipe(label_smoothing=0.1), classes=10)
    assert targets.shape == (8, 10)
    assert torch.allclose(targets.sum(1), torch.ones(8))
    assert torch.allclose(targets[torch.arange(8), labels], torch.full((8,), 0.91))
    assert torch.allclose(targets[0, 1:], torch.full((9,), 0.01))


@pytest.mark.parametrize("recipe", [Recipe(label_smoothing=0.1), Recipe(mixup_alpha=0.8), Recipe(cutmix_alpha=1.0)])
def test_a_record_without_a_label_adds_nothing_to_the_soft_targets(recipe):
    """Label -1 (a record of shards without .cls) was an index error in the batch stage, before the loop
    that counts and refuses such records saw the batch."""
    images, labels, indices = batch(classes=5)
    labels[2] = -1
    stage = BatchStage(recipe, seed=7, num_classes=5, normalized=True)
    _, targets = stage(images.clone(), labels, indices, epoch=0, position=0, rank=0)
    known = run(recipe, data=(images, labels.clamp(min=0), indices))[2][1]
    partner = len(labels) - 1 - 2
    assert torch.all(targets[:, :] >= 0) and torch.isfinite(targets).all()
    assert targets[2].sum() < known[2].sum() and targets[partner].sum() < known[partner].sum() + 1e-6
    others = [k for k in range(len(labels)) if k not in (2, partner)]
    assert torch.allclose(targets[others], known[others])


def test_mixup_blends_each_sample_with_its_mirror_and_mixes_the_targets():
    images, labels, (mixed, targets) = run(Recipe(mixup_alpha=0.8))
    lam = float(targets[0, labels[0]] if labels[0] != labels.flip(0)[0] else 1.0)
    assert 0 < lam < 1
    assert torch.allclose(mixed, images * lam + images.flip(0) * (1 - lam), atol=1e-6)
    expected = torch.nn.functional.one_hot(labels, 5) * lam + torch.nn.functional.one_hot(labels.flip(0), 5) * (1 - lam)
    assert torch.allclose(targets, expected.float())


def test_cutmix_pastes_one_box_and_corrects_lam_to_its_area():
    images, labels, (mixed, targets) = run(Recipe(cutmix_alpha=1.0), position=3)
    changed = (mixed != images).any(dim=1)[0]  # the rows and columns of the pasted box in sample 0
    rows, cols = changed.any(1).nonzero(), changed.any(0).nonzero()
    area = (rows.max() - rows.min() + 1) * (cols.max() - cols.min() + 1)
    lam = 1 - float(area) / (16 * 16)
    assert torch.equal(mixed[:, :, rows.min():rows.max() + 1, cols.min():cols.max() + 1],
                       images.flip(0)[:, :, rows.min():rows.max() + 1, cols.min():cols.max() + 1])
    assert torch.allclose(targets[0, labels[0]], torch.tensor(lam))


def test_mixing_is_seeded_by_epoch_position_and_rank():
    recipe = Recipe(mixup_alpha=0.8, cutmix_alpha=1.0)
    first = run(recipe, position=64)[2]
    assert all(torch.equal(a, b) for a, b in zip(first, run(recipe, position=64)[2]))
    for other in (dict(position=128), dict(epoch=1, position=64), dict(rank=1, position=64)):
        assert not torch.equal(first[1], run(recipe, **other)[2][1]), other


def test_elem_mode_draws_per_sample():
    images, labels, (mixed, targets) = run(Recipe(mixup_alpha=1.0, mix_mode="elem"), position=5)
    lams = [float(targets[i, labels[i]]) for i in range(8) if labels[i] != labels[7 - i]]
    assert len(set(round(l, 6) for l in lams)) > 2
    for i in range(8):
        if labels[i] != labels[7 - i]:
            lam = float(targets[i, labels[i]])
            assert torch.allclose(mixed[i], images[i] * lam + images[7 - i] * (1 - lam), atol=1e-5)


@pytest.mark.parametrize("mode", ["const", "rand", "pixel"])
def test_erasing_fills_the_planned_boxes(mode):
    recipe = Recipe(re_prob=1.0, re_mode=mode)
    images, _, (erased, _) = run(recipe)
    for k, index in enumerate(range(100, 108)):
        (top, left, h, w), = plan_erase(recipe, 7, 0, index, 16)[0]
        box = erased[k, :, top:top + h, left:left + w]
        outside = erased[k].clone()
        outside[:, top:top + h, left:left + w] = images[k, :, top:top + h, left:left + w]
        assert torch.equal(outside, images[k])
        if mode == "const":
            assert torch.equal(box, torch.zeros_like(box))
        elif mode == "rand":
            assert torch.equal(box, box[:, :1, :1].expand_as(box))
        else:
            assert box.std() > 0.5
    assert torch.equal(erased, run(recipe)[2][0])


def test_uint8_output_is_erased_and_mixed_in_pixels():
    data = (torch.randint(0, 256, (4, 3, 16, 16), dtype=torch.uint8), torch.tensor([0, 1, 2, 3]), torch.arange(4))
    images, _, (mixed, _) = run(Recipe(re_prob=1.0, mixup_alpha=0.5), normalized=False, data=data)
    assert mixed.dtype == torch.uint8 and not torch.equal(mixed, images)
    const = run(Recipe(re_prob=1.0), normalized=False, data=data)[2][0]
    (top, left, h, w), = plan_erase(Recipe(re_prob=1.0), 7, 0, 0, 16)[0]
    assert const[0, :, top, left].tolist() == [124, 116, 104]  # the mean colour
