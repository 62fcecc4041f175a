"""make_loader over a datapipe.Mix of an LMDB, a .wds and a plain folder with their own class names:
every backend serves the same (source, record) sequence with the right labels, a mid-epoch state
resumes in another backend at another world size, and the refusals are one line."""
from __future__ import annotations

import collections
import itertools
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from converters import ConvertOptions, convert
from datapipe import Mix, Source, batch_type, make_loader, open_dataset

CLASSES = {"lm": ("cat", "dog"), "wd": ("dog", "zebra"), "fo": ("ant",)}
COUNTS = {"lm": 12, "wd": 7, "fo": 5}
WEIGHTS = {"lm": 0.5, "wd": 0.3, "fo": 0.2}  # 30 samples an epoch: fo's 5 records drawn 6 times
SIZE = 16


def _folder(root: Path, name: str) -> Path:
    rng = np.random.default_rng(len(name))
    for c, cls in enumerate(CLASSES[name]):
        (root / "train" / cls).mkdir(parents=True)
    for i in range(COUNTS[name]):
        cls = CLASSES[name][i % len(CLASSES[name])]
        pixels = rng.integers(0, 255, (24, 20, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(root / "train" / cls / f"{name}{i:03d}.jpg", quality=90)
    return root


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("mix")
    out = {}
    for name, suffix in (("lm", ".lmdb"), ("wd", ".wds")):
        convert(_folder(root / f"{name}-images", name), root / f"{name}{suffix}",
                ConvertOptions(workers=1, progress=False, shard_bytes=64 << 10))
        out[name] = str(root / f"{name}{suffix}")
    out["fo"] = str(_folder(root / "fo", "fo") / "train").rsplit("/train", 1)[0]
    return out


def mix_of(sources, weights=WEIGHTS, epoch_size=30):
    return Mix(dict(sources), weights=weights, epoch_size=epoch_size)


def served(loader, **kw):
    """(source name, record, label) of every sample of one iteration."""
    names = loader.mix.names
    return [(names[s], int(i), int(l)) for b in loader for s, i, l in zip(b.sources, b.indices, b.labels)]


OPTIONS = dict(batch_size=4, image_size=SIZE, fields=("image", "label", "source"), seed=5)
RUNS = {"threads": dict(backend="threads"), "dataloader-0": dict(backend="dataloader", num_workers=0),
        "dataloader-3": dict(backend="dataloader", num_workers=3), "prefetch": dict(backend="prefetch", num_workers=2),
        "dali": dict(backend="dali", num_workers=2)}


@pytest.fixture(scope="module")
def reference(sources):
    return served(make_loader(mix_of(sources), backend="threads", **OPTIONS))


@pytest.mark.parametrize("run", sorted(RUNS))
def test_every_backend_serves_the_same_sources_records_and_labels(sources, reference, run, within):
    if run == "dali":
        pytest.importorskip("nvidia.dali")
    got = served(make_loader(mix_of(sources), **RUNS[run], **OPTIONS))
    assert got == reference


def test_counts_labels_and_classes_are_the_mixs(sources, reference):
    mix = mix_of(sources)
    assert mix.names == ("lm", "wd", "fo") and mix.classes == ["cat", "dog", "zebra", "ant"]
    assert collections.Counter(name for name, _, _ in reference) == {"lm": 15, "wd": 9, "fo": 6}
    for name, record, label in reference:
        own = open_dataset(sources[name])
        assert mix.classes[label] == own.classes[own[record].label]  # the same name, the same class


def test_default_fields_yield_batch_with_indices_inside_each_source(sources, reference):
    loader = make_loader(mix_of(sources), backend="threads", batch_size=4, image_size=SIZE, seed=5)
    batch = next(iter(loader))
    assert type(batch) is batch_type() and len(batch) == 3
    assert [int(i) for i in batch.indices] == [r for _, r, _ in reference[:4]]


def test_default_weights_serve_each_record_once_an_epoch(sources):
    loader = make_loader(Mix(dict(sources)), backend="threads", **OPTIONS)
    got = served(loader)
    assert len(got) == sum(COUNTS.values()) == len(loader.mix)
    assert {(n, r) for n, r, _ in got} == {(n, r) for n, c in COUNTS.items() for r in range(c)}


def test_a_mid_epoch_state_resumes_in_another_backend_at_another_world_size(sources, reference, within):
    """Two ranks on threads take 2 batches each; three ranks on the dataloader backend serve the rest:
    together the uninterrupted run's 30 samples (plus the last world size's padding), none missing."""
    mix = mix_of(sources)
    first = []
    states = []
    for rank in range(2):
        loader = make_loader(mix, backend="threads", rank=rank, world_size=2, **OPTIONS)
        it = iter(loader)
        for _ in range(2):
            b = next(it)
            first += [(mix.names[s], int(i)) for s, i in zip(b.sources, b.indices)]
        states.append(loader.state_dict())
    assert states[0]["samples_done"] == states[1]["samples_done"] == 16
    rest = []
    for rank in range(3):
        loader = make_loader(mix_of(sources), backend="dataloader", num_workers=2, rank=rank, world_size=3, **OPTIONS)
        loader.load_state_dict(states[0])
        rest += [(mix.names[s], int(i)) for b in loader for s, i in zip(b.sources, b.indices)]
    got = collections.Counter(first + rest)
    expected = collections.Counter((n, r) for n, r, _ in reference)
    assert not expected - got
    assert sum((got - expected).values()) < 3  # padding of the 3 ranks' last batches


def shifting(epoch: int) -> dict[str, float]:
    """WEIGHTS for two epochs, then fo's weight doubled (picklable: a weights function must travel)."""
    return WEIGHTS if epoch < 2 else {"lm": 0.4, "wd": 0.2, "fo": 0.4}


@pytest.mark.parametrize("seed", range(3))
def test_loaders_resumed_at_random_world_sizes_workers_and_positions_serve_the_uninterrupted_run(sources, seed):
    """Three epochs, the weights changed after two, each served in segments: a random world size (1-8),
    backend and worker count (threads 0-4, dataloader 0), every rank a random number of batches, then
    rank 0's state_dict() given to the next segment's loaders. Per epoch, all ranks together serve the
    uninterrupted run's (source, record) samples, none missing, the only extras the last world size's
    padding."""
    rng = random.Random(seed)
    whole = make_loader(mix_of(sources, weights=shifting), backend="threads", **OPTIONS)
    expected = [collections.Counter(s[:2] for s in served(whole)) for _ in range(3)]
    state = None
    for epoch in range(3):
        got, world = collections.Counter(), 1
        while state is None or state["epoch"] == epoch:
            world = rng.randint(1, 8)
            backend, workers = rng.choice([("threads", rng.randint(0, 4)), ("dataloader", 0)])
            loaders = [make_loader(mix_of(sources, weights=shifting), backend=backend, num_workers=workers, rank=rank,
                                   world_size=world, **OPTIONS) for rank in range(world)]
            for loader in loaders:
                if state is not None:
                    loader.load_state_dict(state)
            assert loaders[0].epoch == epoch
            left = len(loaders[0]) - loaders[0].batches_done
            take = left if rng.random() < 0.3 else rng.randint(0, left)
            for loader in loaders:
                batches = iter(loader)
                for b in (batches if take == left else (next(batches) for _ in range(take))):
                    got.update((loader.mix.names[s], int(i)) for s, i in zip(b.sources, b.indices))
            state = loaders[0].state_dict()
            if take == left:
                break
        assert not expected[epoch] - got, f"epoch {epoch}: samples never served"
        assert sum((got - expected[epoch]).values()) < world, f"epoch {epoch}: more than the padding served twice"
        assert state["epoch"] == epoch + 1


def test_a_mid_epoch_resume_under_other_weights_is_refused_in_one_line(sources):
    loader = make_loader(mix_of(sources), backend="threads", **OPTIONS)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    other = make_loader(mix_of(sources, weights={"lm": 1, "wd": 1, "fo": 1}), backend="threads", **OPTIONS)
    with pytest.raises(ValueError, match=r"^cannot resume mid-epoch: the state was saved with other per-source counts") as err:
        other.load_state_dict(state)
    assert "\n" not in str(err.value)
    single = make_loader(sources["lm"], backend="threads", batch_size=4, image_size=SIZE)
    with pytest.raises(ValueError, match="saved by a loader over a Mix"):
        single.load_state_dict(state)


def test_a_source_with_its_own_split_and_recipe(sources):
    mix = Mix({"lm": Source(sources["lm"], split="train", recipe="deit"), "wd": sources["wd"]})
    assert mix.recipes[0].name == "deit" and mix.recipes[1] is None
    with pytest.raises(Exception, match="split 'val'"):
        Mix({"lm": Source(sources["lm"], split="val")})


@pytest.mark.parametrize("bad, message", [
    ({"lm": 1, "wd": 1}, "no weight for source 'fo'"),
    ({"lm": 1, "wd": 1, "fo": 1, "xx": 1}, "no source named 'xx'"),
    ({"lm": -1, "wd": 1, "fo": 1}, "source 'lm' has weight -1"),
    ({"lm": 0, "wd": 0, "fo": 0}, "are all 0"),
    ({"lm": float("nan"), "wd": 1, "fo": 1}, "has weight nan"),
])
def test_bad_weights_are_refused_in_one_line(sources, bad, message):
    with pytest.raises(ValueError, match=message):
        mix_of(sources, weights=bad)


def test_a_weights_function_is_checked_per_epoch(sources):
    mix = mix_of(sources, weights=lambda e: WEIGHTS if e == 0 else {"lm": 1})
    assert mix.counts(0) == (15, 9, 6)
    with pytest.raises(ValueError, match=r"epoch 1\).*no weight for source 'wd'"):
        mix.counts(1)


def test_source_field_needs_a_mix(sources):
    with pytest.raises(ValueError, match="'source' is a Mix's field"):
        make_loader(sources["lm"], backend="threads", fields=("image", "source"))


@pytest.mark.parametrize("run", sorted(RUNS))
def test_repeated_augmentation_over_a_mix_in_every_backend(sources, run):
    """aug_repeats=3: each draw three times in a row (30 samples: 10 draws, by the weights), each copy its
    own view; every backend the same sequence; a mid-epoch state resumes in another backend at another
    world size (was: refused, so `datapipe train A B --recipe deit` could not run)."""
    if run == "dali":
        pytest.importorskip("nvidia.dali")
    from datapipe.augment import Recipe

    common = {**OPTIONS, "recipe": Recipe(aug_repeats=3, hflip=0.5), "dtype": torch.uint8}
    reference = make_loader(mix_of(sources), backend="threads", **common)
    batches = list(reference)
    got = [(s, i) for b in batches for s, i in zip(b.sources.tolist(), b.indices.tolist())]
    assert len(got) == 30 and all(len(set(got[k:k + 3])) == 1 for k in range(0, 30, 3))
    assert collections.Counter(s for s, _ in got[::3]) == dict(enumerate(reference.mix.counts(0, 10)))
    images = torch.cat([b.images for b in batches])
    assert any(not torch.equal(images[k], images[k + 1]) for k in range(0, 30, 3))  # the copies' own views
    loader = make_loader(mix_of(sources), **RUNS[run], **common)
    assert [(s, i) for b in loader for s, i in zip(b.sources.tolist(), b.indices.tolist())] == got
    first = make_loader(mix_of(sources), **RUNS[run], **common)
    done = [(s, i) for b in itertools.islice(iter(first), 2) for s, i in zip(b.sources.tolist(), b.indices.tolist())]
    rest = []
    for rank in range(2):
        other = make_loader(mix_of(sources), backend="threads", rank=rank, world_size=2, **common)
        other.load_state_dict(first.state_dict())
        rest += [(s, i) for b in other for s, i in zip(b.sources.tolist(), b.indices.tolist())]
    assert collections.Counter(done + rest) == collections.Counter(got)


def test_a_zero_weight_skips_a_source_that_epoch(sources):
    got = served(make_loader(mix_of(sources, weights={"lm": 1, "wd": 0, "fo": 1}), backend="threads", **OPTIONS))
    assert {n for n, _, _ in got} == {"lm", "fo"}


def test_images_are_the_records_views(sources, reference):
    """The mix serves each record's own pixels: a sample equals the same record served alone (eval view)."""
    mix = mix_of(sources)
    loader = make_loader(mix, backend="threads", batch_size=4, image_size=SIZE, train=False, fields=("image", "source"))
    batch = next(iter(loader))
    for k in range(4):
        name = mix.names[int(batch.sources[k])]
        alone = make_loader(sources[name], backend="threads", batch_size=COUNTS[name], image_size=SIZE, train=False)
        images = next(iter(alone)).images
        assert torch.equal(batch.images[k], images[int(batch.indices[k])])


PLAIN_DEIT = dict(mixup_alpha=0.0, cutmix_alpha=0.0, re_prob=0.0, label_smoothing=0.0, aug_repeats=1)  # its per-record part only


@pytest.mark.parametrize("backend", ["threads", "dataloader"])
def test_a_sources_own_recipe_gives_its_records_that_recipes_views(sources, backend):
    """The first source (keys = its record indices) with DeiT's per-record recipe: each of its samples is
    the view a loader over that source alone with that recipe serves; the other source keeps the loader's."""
    from datapipe.augment.recipe import resolve_recipe

    deit = resolve_recipe("deit", **PLAIN_DEIT)
    mix = Mix({"lm": Source(sources["lm"], recipe=deit), "fo": sources["fo"]})
    common = dict(batch_size=17, image_size=SIZE, dtype=torch.uint8, seed=5)
    batch = next(iter(make_loader(mix, backend=backend, fields=("image", "source"), num_workers=1, **common)))
    alone = next(iter(make_loader(sources["lm"], backend="threads", recipe=deit, **{**common, "batch_size": 12})))
    by_record = {int(i): image for i, image in zip(alone.indices, alone.images)}
    lm = [k for k in range(17) if int(batch.sources[k]) == 0]
    assert len(lm) == 12
    for k in lm:
        assert torch.equal(batch.images[k], by_record[int(batch.indices[k])])
    plain = next(iter(make_loader(Mix({"lm": sources["lm"], "fo": sources["fo"]}), backend=backend,
                                  fields=("image", "source"), num_workers=1, **common)))
    assert not torch.equal(plain.images[lm[0]], batch.images[lm[0]])


def test_dali_applies_a_sources_own_recipe(sources):
    pytest.importorskip("nvidia.dali")
    from datapipe.augment.recipe import resolve_recipe

    deit = resolve_recipe("deit", **PLAIN_DEIT)
    common = dict(batch_size=17, image_size=SIZE, dtype=torch.uint8, seed=5, fields=("image", "source"))
    mixed = Mix({"lm": Source(sources["lm"], recipe=deit), "fo": sources["fo"]})
    dali = next(iter(make_loader(mixed, backend="dali", num_workers=1, **common)))
    cpu = next(iter(make_loader(mixed, backend="threads", **common)))
    assert torch.equal(dali.indices, cpu.indices) and torch.equal(dali.sources, cpu.sources)
    diff = (dali.images.float() - cpu.images.float()).abs().mean()
    assert diff < 1.0, diff  # DALI's ops on its CPU operators, as close as tests/backends/test_dali_recipes.py holds them


def test_each_decode_thread_gets_its_own_handles_of_every_source(sources):
    """threads.thread_view over a mix: each source's per-process handles copied (one thread's shard LRU
    must not close a file another thread reads), the sources themselves still the same data."""
    from datapipe.backends.threads import thread_view
    from datapipe.formats.base import PerProcess
    from datapipe.mix.dataset import MixDataset

    mixed = MixDataset(mix_of(sources))
    view = thread_view(mixed)
    for original, copy in zip(mixed.datasets, view.datasets):
        handles = [name for name, value in vars(original).items() if isinstance(value, PerProcess)]
        assert all(getattr(copy, name) is not getattr(original, name) for name in handles)
    assert any(vars(d).get(n) for d in mixed.datasets for n in vars(d) if isinstance(vars(d)[n], PerProcess))
    assert view[3] == mixed[3]


@pytest.mark.parametrize("backend", ["threads", "dali"])
def test_a_bad_record_is_served_around_within_its_own_source(imagefolder, packed_lmdb, backend):
    """The fixture folder's corrupt files: each is replaced by a record of the folder itself, so every
    epoch still holds each source's exact count."""
    if backend == "dali":
        pytest.importorskip("nvidia.dali")
    mix = Mix({"folder": str(imagefolder), "lmdb": str(packed_lmdb)}, weights={"folder": 1, "lmdb": 1}, epoch_size=40)
    loader = make_loader(mix, backend=backend, batch_size=8, image_size=SIZE, fields=("image", "source"),
                         max_bad_fraction=1.0, num_workers=1)
    got = collections.Counter(mix.names[int(s)] for b in loader for s in b.sources)
    assert got == {"folder": 20, "lmdb": 20}
    assert loader.skipped
    folder_records = mix.sizes[0]
    for bad in loader.skipped:
        assert bad.index < folder_records and bad.substitute < folder_records, bad


def test_a_weights_function_that_cannot_travel_to_spawned_workers_is_one_line(sources):
    mix = mix_of(sources, weights=lambda epoch: WEIGHTS)
    with pytest.raises(ValueError, match="weights function .* cannot be pickled for the DataLoader's workers"):
        make_loader(mix, backend="dataloader", num_workers=1, start_method="spawn", **OPTIONS)


def test_progressive_resizing_over_a_mix(sources):
    loader = make_loader(mix_of(sources), backend="threads", **{**OPTIONS, "image_size": lambda e: 16 + 8 * e})
    sizes = []
    for _ in range(2):
        sizes.append(next(iter(loader)).images.shape[-1])
    assert sizes == [16, 24]


def test_numpy_weights_are_numbers(sources):
    mix = mix_of(sources, weights={"lm": np.float32(0.5), "wd": np.int64(3), "fo": 0.2})
    assert sum(mix.counts(0)) == 30


def test_cache_options_belong_to_the_mix_not_to_make_loader(sources, tmp_path):
    with pytest.raises(ValueError, match=r"give cache_dir= and cache_limit= to Mix\(\.\.\.\)"):
        make_loader(mix_of(sources), backend="threads", cache_dir=str(tmp_path), **OPTIONS)
    with pytest.raises(ValueError, match="sha256= checks one dataset file"):
        make_loader(mix_of(sources), backend="threads", sha256="0" * 64, **OPTIONS)
    mix = Mix(dict(sources), cache_dir=str(tmp_path))
    assert make_loader(mix, backend="threads", cache_dir=str(tmp_path), **OPTIONS).mix is mix
