"""Recipes through the CPU backends: the default recipe is the historical view, the same records get
the same augmentation in every backend, a resume mid-epoch with mixup is exact, progressive resizing
changes the size at an epoch boundary and nothing else, uint8 output, clear errors."""
from __future__ import annotations

import pytest
import torch

from datapipe import make_loader
from datapipe.augment import Recipe, SizeRamp
from datapipe.augment.custom import Transform
from datapipe.formats import open_dataset
from datapipe.augment.view import decode_view, open_encoded, plan_and_decode

CPU_BACKENDS = ["threads", "dataloader", "prefetch"]
SMALL = dict(batch_size=6, image_size=32, num_workers=1, seed=3)


def epoch_batches(loader, epoch=None):
    if epoch is not None:
        loader.set_epoch(epoch)
    return [(b.images.clone(), b.labels.clone(), b.indices.clone()) for b in loader]


def same(a, b) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for p, q in zip(a, b) for x, y in zip(p, q))


# sha256 of every batch of epoch 1 (seed 3, 32 px, batch 4) over the clean fixture folder, taken with
# the code before recipes existed (commit 3dd6859): pixels recovered from the normalized floats. The
# train digest was retaken when the epoch order became computed (#33: datapipe.order.permutation, a keyed Feistel
# permutation): the same records' views (per-record digests unchanged), served in the new order
HISTORICAL = {"train": "9f8ae8ef0c7e6f68ebe1591b8799f1c9c622f088ae8448add52250b0f738af3a",
              "val": "9b8513fccce35f3c73c843919bb2ab22515bfb845de598f70f7f6758b9ec3dd8"}


@pytest.mark.parametrize("backend", ["threads", "dataloader"])
@pytest.mark.parametrize("split", ["train", "val"])
def test_the_default_recipe_serves_exactly_the_batches_served_before_recipes(clean_folder, backend, split):
    import hashlib

    mean = torch.tensor((0.485, 0.456, 0.406)).view(1, 3, 1, 1) * 255
    std = torch.tensor((0.229, 0.224, 0.225)).view(1, 3, 1, 1) * 255
    loader = make_loader(clean_folder, split=split, backend=backend, batch_size=4, image_size=32, seed=3,
                         num_workers=1, train=split == "train")
    loader.set_epoch(1)
    digest = hashlib.sha256()
    for images, labels, indices in loader:
        pixels = (images * std + mean).round().clamp(0, 255).to(torch.uint8)
        for part in (pixels, labels, indices):
            digest.update(part.numpy().tobytes())
    assert digest.hexdigest() == HISTORICAL[split]


def test_the_default_recipe_serves_the_historical_pixels(packed_lmdb):
    """Recipe() = the loader's view before recipes existed: decode_view without a recipe, normalized."""
    loader = make_loader(packed_lmdb, backend="threads", dtype=torch.uint8, **SMALL)
    images, labels, indices = next(iter(loader))
    dataset = open_dataset(packed_lmdb)
    for image, index in zip(images, indices.tolist()):
        expected, _ = plan_and_decode(dataset[index].data, None, 3, 0, index, 32, train=True)
        assert torch.equal(image, expected)
    assert labels.dtype == torch.int64 and labels.dim() == 1
    assert same(epoch_batches(make_loader(packed_lmdb, backend="threads", **SMALL)),
                epoch_batches(make_loader(packed_lmdb, backend="threads", recipe=Recipe(), **SMALL)))


@pytest.mark.parametrize("recipe", ["deit", "tv-v2", "rsb-a3"])
def test_every_cpu_backend_serves_the_same_augmented_batches(packed_lmdb, recipe):
    runs = [epoch_batches(make_loader(packed_lmdb, backend=b, recipe=recipe, **SMALL), 1) for b in CPU_BACKENDS]
    assert same(runs[0], runs[1]) and same(runs[0], runs[2])
    assert runs[0][0][1].dtype == torch.float32 and runs[0][0][1].shape[1] == len(open_dataset(packed_lmdb).classes)


def test_same_seed_same_batches_another_epoch_other_ones(packed_lmdb):
    loader = make_loader(packed_lmdb, backend="threads", recipe="deit", **SMALL)
    first, again = epoch_batches(loader, 0), epoch_batches(make_loader(packed_lmdb, backend="threads", recipe="deit", **SMALL), 0)
    assert same(first, again)
    second = epoch_batches(loader, 1)
    assert not torch.equal(first[0][0], second[0][0])


@pytest.mark.parametrize("backend", ["threads", "dataloader", "dali"])
def test_a_resume_mid_epoch_with_mixup_serves_the_uninterrupted_batches(packed_lmdb, backend):
    if backend == "dali":
        pytest.importorskip("nvidia.dali")
    whole = epoch_batches(make_loader(packed_lmdb, backend=backend, recipe="deit", **SMALL), 2)
    loader = make_loader(packed_lmdb, backend=backend, recipe="deit", **SMALL)
    loader.set_epoch(2)
    it = iter(loader)
    head = [tuple(t.clone() for t in next(it)) for _ in range(2)]
    state = loader.state_dict()
    del it
    resumed = make_loader(packed_lmdb, backend=backend, recipe="deit", **SMALL)
    resumed.load_state_dict(state)
    assert same(head + epoch_batches(resumed), whole)


def test_a_resume_with_another_recipe_is_refused(packed_lmdb):
    state = make_loader(packed_lmdb, backend="threads", recipe="deit", **SMALL).state_dict()
    other = make_loader(packed_lmdb, backend="threads", recipe="deit", re_prob=0.5, **SMALL)
    with pytest.raises(ValueError, match=r"another augmentation recipe \(re_prob: 0.25 != 0.5\)"):
        other.load_state_dict(state)


def test_progressive_resizing_changes_the_size_at_the_epoch_boundary_only(packed_lmdb):
    loader = make_loader(packed_lmdb, backend="dataloader", **{**SMALL, "num_workers": 1})
    fixed = make_loader(packed_lmdb, backend="dataloader", **SMALL)
    first = epoch_batches(loader, 0)
    loader.set_image_size(48)
    assert all(b[0].shape[-1] == 32 for b in first)
    resized, reference = epoch_batches(loader, 1), epoch_batches(fixed, 1)
    assert all(b[0].shape[-1] == 48 for b in resized)
    assert [b[2].tolist() for b in resized] == [b[2].tolist() for b in reference]  # the same order
    assert loader.state_dict()["image_size"] == 48


def test_a_resume_mid_epoch_at_another_image_size_is_refused(packed_lmdb):
    loader = make_loader(packed_lmdb, backend="threads", **SMALL)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    del it
    with pytest.raises(ValueError, match="served at image_size 32, this loader serves it at 48"):
        make_loader(packed_lmdb, backend="threads", **{**SMALL, "image_size": 48}).load_state_dict(state)
    epoch_end = make_loader(packed_lmdb, backend="threads", **SMALL)
    epoch_batches(epoch_end, 0)
    make_loader(packed_lmdb, backend="threads", **{**SMALL, "image_size": 48}).load_state_dict(epoch_end.state_dict())


def test_a_size_schedule_per_epoch(packed_lmdb):
    ramp = SizeRamp(16, 48, start_epoch=1, end_epoch=3, step=16)
    assert [ramp(e) for e in range(5)] == [16, 16, 32, 48, 48]
    loader = make_loader(packed_lmdb, backend="threads", image_size=ramp, batch_size=6, num_workers=1)
    sizes = [next(iter(loader)).images.shape[-1] for _ in range(4)]
    assert sizes == [16, 16, 32, 48]
    with pytest.raises(ValueError, match="it must return an int >= 8"):
        loader.set_image_size(lambda epoch: 4)
        next(iter(loader))


def test_uint8_output_is_the_pixels(packed_lmdb):
    images = next(iter(make_loader(packed_lmdb, backend="dataloader", dtype=torch.uint8, **SMALL))).images
    normalized = next(iter(make_loader(packed_lmdb, backend="dataloader", **SMALL))).images
    mean = torch.tensor((0.485, 0.456, 0.406)).view(1, 3, 1, 1)
    std = torch.tensor((0.229, 0.224, 0.225)).view(1, 3, 1, 1)
    assert images.dtype == torch.uint8
    assert torch.allclose((images.float() / 255 - mean) / std, normalized, atol=1e-5)


def test_recipe_keywords_and_their_errors(packed_lmdb):
    loader = make_loader(packed_lmdb, backend="threads", recipe="deit", mixup_alpha=0.0, cutmix_alpha=0.0, **SMALL)
    assert loader.recipe.auto_augment == "rand-m9-mstd0.5-inc1" and not loader.recipe.mixes
    with pytest.raises(ValueError, match="recipe must be a datapipe.Recipe or one of"):
        make_loader(packed_lmdb, recipe="deit3")
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['re_probability'\].*Recipe fields .*'re_prob'"):
        make_loader(packed_lmdb, re_probability=0.5)


def test_eval_views_use_the_recipes_crop_pct_and_interpolation(packed_lmdb):
    dataset = open_dataset(packed_lmdb, "val")
    loader = make_loader(packed_lmdb, split="val", backend="threads", train=False, recipe="rsb-a3",
                         dtype=torch.uint8, **SMALL)
    images, _, indices = next(iter(loader))
    for image, index in zip(images, indices.tolist()):
        assert torch.equal(image, plan_and_decode(dataset[index].data, loader.recipe, 3, 0, index, 32, train=False)[0])
    default, _ = plan_and_decode(dataset[int(indices[0])].data, None, 3, 0, 0, 32, train=False)
    assert not torch.equal(images[0], default)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_each_record_gets_its_planned_ops(packed_lmdb, backend):
    """The served pixels are the planner's view plus the planner's ops for that record and epoch."""
    from datapipe.augment.cpu import apply_ops
    from datapipe.augment.plan import fill_color, plan_sample
    from datapipe.image.layout import image_dims

    recipe = Recipe(auto_augment="rand-m9-n3-mstd0.5", color_jitter=0.4, grayscale_prob=0.3, vflip=0.5)
    loader = make_loader(packed_lmdb, backend=backend, recipe=recipe, dtype=torch.uint8, **SMALL)
    dataset, with_ops = open_dataset(packed_lmdb), 0
    for images, _, indices in epoch_batches(loader, 1):
        for image, index in zip(images, indices.tolist()):
            data = dataset[index].data
            plan = plan_sample(recipe, 3, 1, index, 32, *image_dims(data))
            view = decode_view(open_encoded(data), plan)
            assert torch.equal(image, apply_ops(view, plan.ops, fill=fill_color(recipe)))
            with_ops += bool(plan.ops) and not torch.equal(image, view)
    assert with_ops >= 10


class ChannelShuffle(Transform):
    """A portable transform: its permutation drawn from the planner's stream."""

    def draw(self, rng):
        order = [0, 1, 2]
        rng.shuffle(order)
        return order

    def apply(self, image, order):
        return image[order].contiguous()


def noisy(image: torch.Tensor) -> torch.Tensor:
    """An opaque transform drawing from torch's global generator."""
    return (image.int() + torch.randint(0, 60, image.shape)).clamp(0, 255).to(torch.uint8)


def test_a_portable_transform_gets_the_same_parameters_in_every_cpu_backend(packed_lmdb):
    runs = [epoch_batches(make_loader(packed_lmdb, backend=b, transform=ChannelShuffle(), dtype=torch.uint8, **SMALL), 1)
            for b in CPU_BACKENDS]
    plain = epoch_batches(make_loader(packed_lmdb, backend="threads", dtype=torch.uint8, **SMALL), 1)
    assert same(runs[0], runs[1]) and same(runs[0], runs[2]) and not same(runs[0], plain)


def test_an_opaque_transform_is_deterministic_per_record_in_worker_processes(packed_lmdb):
    one = epoch_batches(make_loader(packed_lmdb, backend="dataloader", transform=noisy, dtype=torch.uint8,
                                    **{**SMALL, "num_workers": 1}), 0)
    two = epoch_batches(make_loader(packed_lmdb, backend="dataloader", transform=noisy, dtype=torch.uint8,
                                    **{**SMALL, "num_workers": 2}), 0)
    assert same(one, two)
    other = epoch_batches(make_loader(packed_lmdb, backend="dataloader", transform=noisy, dtype=torch.uint8, **SMALL), 1)
    assert not torch.equal(one[0][0], other[0][0])


@pytest.mark.parametrize("backend", ["threads", "dali"])
def test_an_opaque_transform_is_refused_where_it_cannot_be_made_deterministic(packed_lmdb, backend):
    with pytest.raises(ValueError, match=f"backend='{backend}' cannot"):
        make_loader(packed_lmdb, backend=backend, transform=noisy, **SMALL)


def test_a_transform_that_changes_the_image_shape_is_named(packed_lmdb):
    loader = make_loader(packed_lmdb, backend="dataloader", transform=lambda im: im[:, :8], **{**SMALL, "num_workers": 0})
    with pytest.raises(ValueError, match=r"must return a uint8 tensor of shape \(3, 32, 32\)"):
        next(iter(loader))


def broken(image: torch.Tensor) -> torch.Tensor:
    raise RuntimeError("my transform bug")


@pytest.mark.parametrize("backend", ["dataloader", "prefetch"])
def test_an_error_in_the_transform_is_raised_not_served_around_as_a_bad_record(packed_lmdb, backend):
    """on_error="skip" is for bad data: a failing transform is a bug, and no record is substituted."""
    loader = make_loader(packed_lmdb, backend=backend, transform=broken, on_error="skip", max_bad_fraction=1.0, **SMALL)
    with pytest.raises(RuntimeError, match="my transform bug"):
        next(iter(loader))
    assert loader.skipped == []


def test_repeated_augmentation_serves_each_record_in_a_row_with_its_own_augmentation(packed_lmdb):
    """timm's RepeatAugSampler: an epoch as long as the dataset, each of a third of the records 3
    times in a row, every copy with its own crop, ops and erasing box."""
    recipe = Recipe(auto_augment="rand-m9-mstd0.5-inc1", re_prob=1.0, aug_repeats=3)
    loader = make_loader(packed_lmdb, backend="threads", recipe=recipe, dtype=torch.uint8, **SMALL)
    served = epoch_batches(loader, 0)
    indices = torch.cat([b[2] for b in served]).tolist()
    size = len(loader.dataset)
    assert len(indices) == size
    runs = [indices[i:i + 3] for i in range(0, size - size % 3, 3)]
    assert all(len(set(run)) == 1 for run in runs) and len({run[0] for run in runs}) == len(runs)
    images = torch.cat([b[0] for b in served])
    for k in range(0, 3 * len(runs), 3):
        assert not torch.equal(images[k], images[k + 1]) and not torch.equal(images[k + 1], images[k + 2])
    assert epoch_batches(loader, 1)[0][2].tolist() != served[0][2].tolist()


def test_repeated_copies_go_to_different_ranks(packed_lmdb):
    ranks = [torch.cat([b[2] for b in epoch_batches(make_loader(packed_lmdb, backend="threads", recipe="deit",
                                                               rank=r, world_size=3, **SMALL), 0)]).tolist()
             for r in range(3)]
    assert ranks[0] == ranks[1] == ranks[2]  # position 3j + r holds the r-th copy of the j-th record


def test_repeated_augmentation_needs_global_sampling(packed_wds):
    with pytest.raises(ValueError, match="needs sampling='global'"):
        make_loader(packed_wds, recipe="deit", sampling="shards", **SMALL)
