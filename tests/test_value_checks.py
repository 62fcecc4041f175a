"""#38 row 9: recipe, loader, size-schedule and train values are checked for type, finiteness and range
in one place (datapipe.checks): each refusal one ValueError line naming the field, the value and the
range; every extreme accepted gives finite batches and targets."""
from __future__ import annotations

import math
import re

import pytest
import torch

from datapipe import checks, make_loader
from datapipe.augment import Recipe, SizeRamp
from datapipe.augment.recipe import parse_auto_augment
from datapipe.backends.options import LoaderOptions
from datapipe.cli.main import main
from datapipe.train.config import TrainConfig

NAN, INF = math.nan, math.inf


@pytest.mark.parametrize("fields,message", [
    (dict(std=(NAN, 1, 1)), r"std must be 3 finite numbers, each within \[0.0001, 1\] .*got \(nan, 1, 1\)"),
    (dict(std=(1e-320,) * 3), r"std must be 3 finite numbers, each within \[0.0001, 1\] .*got \(1e-320,"),
    (dict(std=(58.395, 57.12, 57.375)), r"std must be .*on the 0..1 scale.*got \(58.395"),  # 0..255 scale
    (dict(mean=NAN), r"mean must be 3 finite numbers, each within \[0, 1\] .*got nan"),
    (dict(mean=(NAN, 0.456, 0.406)), r"mean must be 3 finite numbers, each within \[0, 1\] .*got \(nan,"),
    (dict(mixup_alpha=INF), r"mixup_alpha must be a finite number within \[0, 100\] \(0: off\), got inf"),
    (dict(cutmix_alpha=NAN), r"cutmix_alpha must be a finite number within \[0, 100\] \(0: off\), got nan"),
    (dict(ratio=(1, INF)), r"ratio must be a pair \(low, high\) of finite numbers with 0.01 <= low <= high <= 100 "
                           r".*got \(1, inf\)"),
    (dict(crop_pct=1e-9), r"crop_pct must be a finite number within \[0.25, 1\] .*got 1e-09"),
    (dict(color_jitter=NAN), r"color_jitter must be a finite number within \[0, 10\] .*got nan"),
    (dict(color_jitter=(0.4, INF, 0.4)), r"color_jitter must be 3 finite numbers, each within \[0, 10\]"),
    (dict(hflip=True), r"hflip must be a probability, a number within \[0, 1\], got True"),
    (dict(re_count=10**9), r"re_count must be within 1..32 \(an int: erasing boxes per image\), got 1000000000"),
    (dict(aug_repeats=True), r"aug_repeats must be within 1..16 \(an int\), got True"),
    (dict(auto_augment="rand-m9-mmax" + "9" * 400), r"auto_augment='rand-m9-mmax9+\.\.\.: 'mmax9+\.\.\. is past any "
                                                     r"float; m and mmax are within 0..100"),
    (dict(auto_augment="rand-n" + "9" * 400), r"auto_augment='rand-n9+\.\.\.: 'n9+\.\.\. is past any float"),
    (dict(auto_augment="rand-m9-mmax1000"), r"auto_augment='rand-m9-mmax1000': mmax must be a finite number within "
                                            r"\[0, 100\]"),
])
def test_a_recipe_value_out_of_range_is_one_line_naming_field_value_and_range(fields, message):
    with pytest.raises(ValueError, match=message) as refused:
        Recipe(**fields)
    assert "\n" not in str(refused.value) and len(str(refused.value)) < 220


@pytest.mark.parametrize("options,message", [
    (dict(image_size=10**5), r"image_size must be within 8..8192 \(an int, pixels a side, at most MAX_IMAGE_SIZE=8192\)"
                             r", got 100000"),
    (dict(image_size="224"), r"image_size must be within 8..8192 \(an int.*got '224'"),
    (dict(image_size=True), r"image_size must be within 8..8192 \(an int.*got True"),
    (dict(batch_size=True), r"batch_size must be >= 1 \(an int\), got True"),
    (dict(batch_size=4096, image_size=8192), r"batch_size=4096 at image_size=8192 in torch.float32 is 3,072 GiB a "
                                             r"batch, more than MAX_BATCH_BYTES=64 GiB"),
    (dict(prefetch_factor=INF), r"prefetch_factor must be within 1..64 \(an int: batches each worker holds ready\), "
                                r"got inf"),
    (dict(num_workers=10**6), r"num_workers must be within 0..1024 \(an int; None: this rank's share of the CPUs\)"),
    (dict(cache_limit=NAN), r"cache_limit must be a finite number >= 1 \(bytes the shard cache may hold\) or None, "
                            r"got nan"),
    (dict(max_bad_fraction=INF), r"max_bad_fraction must be a probability, a number within \[0, 1\], got inf"),
    (dict(seed=-1), r"seed must be within 0..9223372036854775807 \(an int\), got -1"),
    (dict(interleave_shards=True), r"interleave_shards must be an int >= 1 \(1: shard by shard\) or None, got True"),
])
def test_a_loader_option_out_of_range_is_one_line(options, message):
    with pytest.raises(ValueError, match=message):
        LoaderOptions(**options)


def test_make_loader_refuses_a_huge_image_size_before_any_allocation(clean_folder):
    """10^5 px asked the allocator for a 1.75 TiB batch (a raw RuntimeError), now one line at once."""
    with pytest.raises(ValueError, match=r"image_size must be within 8..8192 .*got 100000"):
        make_loader(clean_folder, image_size=10**5, batch_size=64, num_workers=0)


def test_a_size_schedule_returning_a_str_names_what_it_gave_and_the_epoch(clean_folder):
    """A callable image size is checked when it is called: its value and type, and the epoch asked."""
    with pytest.raises(ValueError, match=r"the image size schedule gave '224' \(str\) for epoch 0: it must return an "
                                         r"int >= 8, at most MAX_IMAGE_SIZE=8192"):
        make_loader(clean_folder, image_size=lambda epoch: "224", batch_size=4, num_workers=0)
    loader = make_loader(clean_folder, image_size=lambda epoch: 16 if epoch == 0 else 16.0, batch_size=4,
                         num_workers=0, backend="dataloader")
    assert loader.image_size_at(0) == 16
    with pytest.raises(ValueError, match=r"the image size schedule gave 16.0 \(float\) for epoch 3"):
        loader.image_size_at(3)


def test_a_size_schedule_is_checked_with_the_batch_it_would_fill(clean_folder):
    """An epoch's size within 8..8192 whose batch would pass MAX_BATCH_BYTES: refused for that epoch."""
    loader = make_loader(clean_folder, image_size=lambda epoch: 8192 if epoch >= 2 else 16, batch_size=256,
                         num_workers=0, backend="dataloader")
    assert loader.image_size_at(1) == 16
    with pytest.raises(ValueError, match=r"batch_size=256 at image_size=8192 \(epoch 2's image size\) in "
                                         r"torch.float32 is 192 GiB a batch, more than MAX_BATCH_BYTES=64 GiB"):
        loader.image_size_at(2)
    with pytest.raises(ValueError, match=r"batch_size=256 at image_size=8192 \(epoch 0's image size\)"):
        loader.set_image_size(8192)  # a fixed size: refused when set


@pytest.mark.parametrize("rank,world_size,message", [
    (0, "2", r"world_size must be >= 1 \(an int\), got '2'"),
    (0, 2.5, r"world_size must be >= 1 \(an int\), got 2.5"),
    (True, 2, r"rank must be within 0..1 \(an int\), got True"),
])
def test_make_loader_checks_rank_and_world_size_by_type_first(clean_folder, rank, world_size, message):
    with pytest.raises(ValueError, match=message):
        make_loader(clean_folder, rank=rank, world_size=world_size, batch_size=4, num_workers=0)


@pytest.mark.parametrize("ramp,message", [
    (dict(min_size=8, max_size=10**5, start_epoch=0, end_epoch=5), r"SizeRamp max_size must be within 8..8192"),
    (dict(min_size="160", max_size=192, start_epoch=0, end_epoch=5), r"SizeRamp min_size must be within 8..8192 "
                                                                     r"\(an int.*got '160'"),
    (dict(min_size=160, max_size=192, start_epoch=0, end_epoch=5, step=True), r"SizeRamp step must be within "
                                                                               r"1..8192 \(an int\), got True"),
])
def test_a_size_ramp_out_of_range_is_one_line(ramp, message):
    with pytest.raises(ValueError, match=message):
        SizeRamp(**ramp)


def test_a_ramp_whose_step_does_not_divide_its_sizes_stays_within_them():
    ramp = SizeRamp(min_size=8, max_size=16, start_epoch=0, end_epoch=4, step=32)
    assert [ramp(e) for e in range(6)] == [8, 8, 8, 8, 16, 16]  # the rounding gave 0 (epochs 1..3) before


@pytest.mark.parametrize("values,message", [
    (dict(image_size=10**5), r"image_size must be within 8..8192"),
    (dict(lr=INF), r"lr must be a finite number > 0, got inf"),
    (dict(lr=NAN), r"lr must be a finite number > 0, got nan"),
    (dict(momentum=NAN), r"momentum must be a finite number within \[0, 1\), got nan"),
    (dict(warmup_epochs=INF), r"warmup_epochs must be a finite number >= 0, got inf"),
    (dict(weight_decay=NAN), r"weight_decay must be a finite number >= 0, got nan"),
    (dict(epochs=True), r"epochs must be >= 1 \(an int\), got True"),
    (dict(model_ema_decay=NAN), r"model_ema_decay must be a finite number within \[0, 1\)"),
    (dict(label_smoothing=NAN), r"label_smoothing must be a finite number within \[0, 1\), got nan"),
    (dict(workers=-1), r"workers must be >= 0 \(an int\), got -1"),
    (dict(seed=2**64), r"seed must be within 0..9223372036854775807 \(an int\), got 18446744073709551616"),
])
def test_a_train_option_out_of_range_is_one_line(values, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(data="data", out="out", **values)


def test_train_refuses_a_bad_eval_crop_at_the_start_not_after_an_epoch(clean_folder, tmp_path, capsys):
    """--crop-pct 1e-9 trained a whole epoch, then crashed at evaluation (a 10^11-pixel resize)."""
    run = tmp_path / "run"
    code = main(["train", str(clean_folder), "--out", str(run), "--model", "resnet18", "--epochs", "1",
                 "--batch-size", "8", "--image-size", "16", "--workers", "0", "--crop-pct", "1e-9"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0
    assert "crop_pct must be a finite number within [0.25, 1]" in err and "got 1e-09" in err
    assert not run.exists()  # nothing trained, nothing written


# The extremes each range accepts, together: the smallest std (in float16, the narrowest dtype), mean at
# both ends, the widest ratio, the smallest scale, the strongest jitter and auto-augment, the most
# erasing boxes, the largest and the smallest alphas, the sharpest smoothing, the smallest crop_pct.
EXTREMES = {
    "jitter": dict(std=(1e-4,) * 3, mean=(0.0, 1.0, 0.0), scale=(5e-324, 1.0), ratio=(0.01, 100.0), hflip=1.0,
                     vflip=1.0, color_jitter=(10.0, 10.0, 10.0), grayscale_prob=1.0, re_prob=1.0, re_mode="pixel",
                     re_count=32, crop_pct=0.25, mixup_alpha=100.0, cutmix_alpha=5e-324, mixup_prob=1.0,
                     switch_prob=0.5, mix_mode="elem", label_smoothing=math.nextafter(1.0, 0.0)),
    "augment": dict(std=(1.0, 1e-4, 1.0), mean=(1.0, 0.0, 1.0), ratio=(100.0, 100.0), scale=(1.0, 1.0),
                      auto_augment="rand-m100-n4-mstd101-mmax100-inc1", re_prob=1.0, re_mode="rand", re_count=32,
                      crop_pct=1.0, cutmix_alpha=100.0, mixup_alpha=5e-324, label_smoothing=0.0),
}


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("name", sorted(EXTREMES))
def test_no_accepted_extreme_lets_a_nan_or_inf_into_a_batch(clean_folder, name, dtype):
    recipe = Recipe(**EXTREMES[name])
    for train in (True, False):
        loader = make_loader(clean_folder, split="train", recipe=recipe, train=train, dtype=dtype, batch_size=8,
                             image_size=16, num_workers=0, backend="dataloader", seed=1)
        for batch in loader:
            assert torch.isfinite(batch.images).all(), (name, dtype, train)
            assert torch.isfinite(batch.labels.float()).all(), (name, dtype, train)
            assert batch.images.float().abs().max() <= 1e4 + 1  # at most 1 / the smallest std


def test_the_auto_augment_strings_at_the_edges_still_read():
    assert parse_auto_augment("rand-m100-mmax100").magnitude_max == 100
    assert parse_auto_augment("rand-mstd" + "9" * 400).magnitude_std == INF  # timm: above 100, uniform


class _ReprRaises:
    def __repr__(self):
        raise RuntimeError("no repr")


@pytest.mark.parametrize("call, words", [
    (lambda: checks.integer("start_epoch", 10**5000, 0, 100), "an int of about 5,000 digits"),
    (lambda: checks.real("lr", 10**400, 0), "an int of about 400 digits"),  # float() overflowed
    (lambda: checks.real("lr", [[1]] * 100, 0), "a list of 100 items"),
    (lambda: checks.real("lr", _ReprRaises(), 0), "<a _ReprRaises>"),
    (lambda: SizeRamp(160, 192, start_epoch=10**5000, end_epoch=3), "an int of about 5,000 digits"),
])
def test_a_value_too_big_to_show_is_described_in_one_line(call, words):
    """Python's own repr refuses ints past 4,300 digits and recurses on deep lists: the message said that."""
    with pytest.raises(ValueError, match=re.escape(words)):
        call()
