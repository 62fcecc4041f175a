"""`make_loader`: one iterator interface over every format, with the backend chosen by name or "auto"."""
from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import torch

from ..augment.custom import Transform
from ..augment.recipe import Recipe, resolve_recipe
from ..augment.resolution import size_schedule
from ..checks import shown
from ..formats import open_dataset
from ..formats.base import Dataset
from ..mix.dataset import MixDataset
from ..mix.order import MixOrder, MixState
from ..mix.sources import Mix
from ..order.sharding import READ_AHEAD_SHARDS, EpochOrder, Shard, ShardOrder, resolve_shard
from ..resources import local_world_size
from .base import Loader
from .options import LoaderOptions
from .registry import BackendSpec, Situation, backend_spec, choose, transform_backends

log = logging.getLogger("datapipe")


def choose_backend(backend: str, device: torch.device, *, remote: bool = False) -> tuple[str, str]:
    """(backend name, why) for a requested name or "auto" (the registry's rules, datapipe.backends.registry);
    `remote`: the dataset is read from an object store."""
    return choose(backend, Situation(device.type, remote))


def check_transform(transform: Any, spec: BackendSpec, *, workers: int) -> None:
    """A ValueError in one line where the backend cannot honour `transform` per record (its spec's
    `transforms`; datapipe.augment.custom says why)."""
    if transform is None:
        return
    portable = isinstance(transform, Transform)
    if not portable and not callable(transform):
        raise ValueError(f"transform must be a datapipe.Transform or a callable on a uint8 CHW tensor, "
                         f"got {shown(transform)}")
    if spec.transforms == "none":
        raise ValueError(f"backend={spec.name!r} cannot apply a Python transform inside its graph: "
                         f"{_honouring('portable')}")
    if not portable and spec.transforms != "any" and not (spec.inline_without_workers and workers == 0):
        raise ValueError(f"backend={spec.name!r} cannot make an opaque transform ({type(transform).__name__}) "
                         f"deterministic per record (its decode threads share the global random generators): "
                         f"{_honouring('any')}, or write it as a datapipe.Transform (draw + apply)")


def _honouring(kind: str) -> str:
    """Which registered backends take a transform of `kind`, as advice."""
    names = transform_backends(kind)
    return (f"use backend={' or '.join(repr(b) for b in names)}" if names else
            f"no registered backend takes {'any callable' if kind == 'any' else 'a datapipe.Transform'}")


def shards_held(options: LoaderOptions, shard_samples: list[int], interleave_shards: int) -> int:
    """Shards one rank's readers hold in the cache at once under shard-wise sampling: its workers'
    batches in flight span a window of consecutive shards; each reader also pins the shard before
    its window (datapipe.storage.files) and fetches READ_AHEAD_SHARDS past it. When training, shards
    are interleaved in blocks of ShardOrder.interleave_shards: the window spans whole blocks, and the
    next block's shards are fetched while one is read (ShardOrder.shards_ahead), which where the window
    straddles two blocks reaches into a third: at most the window's shards, at most a block's. Never
    more than the split has."""
    in_flight = max(options.workers, 1) * options.prefetch_factor * options.batch_size
    smallest = max(1, min(shard_samples))
    window = math.ceil(in_flight / smallest)
    block = min(interleave_shards, len(shard_samples)) if options.train else 1
    if block == 1:
        return min(window + 2 + READ_AHEAD_SHARDS, len(shard_samples))
    lead = math.ceil((block - 1) * sum(shard_samples) / len(shard_samples) / smallest)
    blocks = math.ceil(in_flight / (block * smallest)) + 1
    return min(block * blocks + min(window, lead) + 1 + READ_AHEAD_SHARDS, len(shard_samples))


def shard_block(options: LoaderOptions, dataset: Dataset) -> int:
    """How many shards shard-wise reading interleaves: the option given, else 1 for datapipe's own shards
    (shuffled when written: read shard by shard they are already mixed), else ShardOrder.interleave_shards."""
    return options.interleave_shards or (1 if dataset.shuffled_at_write else ShardOrder.interleave_shards)


def make_order(dataset: Dataset, options: LoaderOptions, shard: Shard) -> EpochOrder | ShardOrder:
    """The global permutation, or shard-wise sampling (the default for remote datasets, on request for
    local shards); a remote dataset's cache must hold what its ranks read at once. A mix: its own order."""
    if isinstance(dataset, MixDataset):
        return mix_order(dataset, options, shard)
    sampling = options.sampling
    if sampling == "auto":
        sampling = "shards" if dataset.location.remote else "global"
    if sampling == "global":
        if dataset.location.remote:
            dataset.location.cache.require(dataset.shard_entries().total_bytes,
                                           "sampling='global' reads from every shard all epoch long: its shards")
        return EpochOrder(len(dataset), options.batch_size, shard, options.seed, shuffle=options.train,
                          drop_last=options.drop_last, repeats=options.recipe.aug_repeats if options.train else 1)
    if options.train and options.recipe.aug_repeats > 1:
        raise ValueError(f"aug_repeats={options.recipe.aug_repeats} (repeated augmentation) needs sampling='global'; "
                         "shard-wise sampling reads each record once per epoch: give sampling='global', or "
                         "aug_repeats=1 (datapipe train: --sampling global or --aug-repeats 1)")
    sizes = getattr(dataset, "shard_sizes", None)
    if sizes is None:
        raise ValueError(f"sampling='shards' needs a sharded dataset (.wds or shard files); {dataset} is "
                         f"{dataset.format!r}: use sampling='global'")
    block = shard_block(options, dataset)
    if dataset.location.remote:
        cache = dataset.location.cache
        biggest = dataset.shard_entries().largest
        ranks, held = local_world_size() or 1, shards_held(options, [int(n) for n in sizes()], block)
        cache.require(ranks * held * biggest,
                      f"{ranks} rank(s) on this node, each holding {held} shards at once (those its workers' "
                      f"batches in flight span, a neighbour each end, {READ_AHEAD_SHARDS} read ahead) of up to "
                      f"{biggest:,} bytes,")
    return ShardOrder(tuple(int(n) for n in sizes()), options.batch_size, shard, options.seed, shuffle=options.train,
                      drop_last=options.drop_last, interleave_shards=block)


def mix_order(dataset: MixDataset, options: LoaderOptions, shard: Shard) -> MixOrder:
    """A mix's order. Each source is a stream of permutations of its records; a remote sharded source
    (sampling="auto"), or every sharded one (sampling="shards"), is read shard by shard, a few shards
    at a time (mix.draws.ShardStream), so a node's cache holds a window of it, not all of it."""
    sizes, blocks, windows = [], [], []
    for source in dataset.datasets:
        shards = getattr(source, "shard_sizes", None)
        local = options.sampling == "shards" or (options.sampling == "auto" and source.location.remote)
        sizes.append(tuple(int(n) for n in shards()) if local and shards is not None else None)
        blocks.append(shard_block(options, source))
        if source.location.remote and sizes[-1] is None:
            source.location.cache.require(source.shard_entries().total_bytes,
                                          f"a Mix reads from every shard of {source} all epoch long (sampling="
                                          f"{options.sampling!r}): its shards")
        elif source.location.remote:
            windows.append((source, blocks[-1]))
    for source, block in windows:  # the node's ranks read the same window of the stream: two blocks, what's in flight
        biggest = source.shard_entries().largest
        sizes_of = [int(n) for n in source.shard_sizes()]
        held = min(2 * block + shards_held(options, sizes_of, 1), len(sizes_of))
        source.location.cache.require(held * biggest, f"a Mix reads {source} shard by shard: about {held} shards at "
                                                      f"once (2 blocks of {block} and what batches in flight span)")
    return MixOrder(dataset.mix.epoch_size, options.batch_size, shard, options.seed, shuffle=options.train,
                    drop_last=options.drop_last, repeats=options.recipe.aug_repeats if options.train else 1,
                    state=MixState(dataset.mix, shard_sizes=tuple(sizes), interleave_shards=tuple(blocks)))


def make_loader(source: "str | Path | Dataset | Mix", *, split: str = "train", backend: str = "auto",
                rank: int | None = None, world_size: int | None = None,
                options: LoaderOptions | None = None, sha256: str | None = None, **overrides: Any) -> Loader:
    """A loader of Batch(images, labels, indices) over a packed dataset, an image folder, or shards.

    Options are LoaderOptions fields, given as `options=` or as keywords (batch_size=256, train=True,
    image_size=224, seed=0, device=None, dtype=torch.float32, channels_last=False, drop_last=False,
    num_workers=None, prefetch_factor=2, pin_memory=None, on_error="skip", sampling="auto",
    cache_dir=None, cache_limit=None, interleave_shards=None (mix_shards=, its name before, is taken too),
    batch_format="batch"; "pair" yields (images, labels)
    for code written for a DataLoader over ImageFolder). `fields=("image", "text")` yields (images, texts,
    indices): any of "image" (first), "label", "text" (captions: list[str]), "meta" (JSON metadata: list[dict]),
    "multilabel" (N x classes multi-hot float32), each a field the dataset carries (Dataset.fields);
    `tokenizer=` (caption -> token ids) runs where samples are decoded and makes texts a LongTensor N x L
    (a list of 1-D ones when lengths differ); datapipe.batch_type(fields) is the batch's class.
    `recipe=`: a datapipe.Recipe or a preset name ("deit", "rsb-a3", "ffcv-rn50", "tv-v2"); Recipe fields
    given as keywords (auto_augment=, re_prob=, mixup_alpha=, ...) change it. `image_size` may be a function
    of the epoch (datapipe.SizeRamp) or a step schedule ({first epoch: size}, or a list of sizes, one an epoch).
    dtype=torch.uint8 gives un-normalized images. `source` may be a `.wds` URL (s3://, gs://, az://, https://),
    or a datapipe.Mix of several datasets (indices then count inside each source; fields=(..., "source") adds
    each sample's source number, into mix.names).
    rank and world_size default to torch.distributed's when it is initialized. Call set_epoch(e)
    before each epoch. `sha256`: an LMDB or HDF5 file is opened only if it has this digest (see open_dataset).
    """
    recipe_fields = {k: overrides.pop(k) for k in list(overrides) if k in Recipe.__dataclass_fields__ and k != "name"}
    if "mix_shards" in overrides:  # interleave_shards' name before #49
        if "interleave_shards" in overrides:
            raise ValueError("make_loader got both interleave_shards and mix_shards (its former name): give one")
        overrides["interleave_shards"] = overrides.pop("mix_shards")
    unknown = sorted(set(overrides) - set(LoaderOptions.__dataclass_fields__))
    if unknown:
        raise ValueError(f"make_loader got unknown option(s) {unknown}: it takes LoaderOptions fields "
                         f"{sorted(LoaderOptions.__dataclass_fields__)} and Recipe fields "
                         f"{sorted(k for k in Recipe.__dataclass_fields__ if k != 'name')}")
    image_size = overrides.get("image_size", options.image_size if options else LoaderOptions.image_size)
    if callable(image_size) or isinstance(image_size, (dict, list, tuple)):
        schedule = size_schedule(image_size)
        overrides["image_size"] = schedule(0)
    else:
        schedule = None
    base = overrides.pop("recipe", options.recipe if options else None)
    overrides["recipe"] = resolve_recipe(base, **recipe_fields)
    options = LoaderOptions(**{**(options.__dict__ if options else {}), **overrides})
    if sha256 is not None and isinstance(source, Dataset):
        raise ValueError("sha256= checks a file before it is opened: pass the dataset's path, not an opened Dataset")
    if isinstance(source, Mix):
        source.refuse_other_opening(options.cache_dir, options.cache_limit, sha256)
        dataset: Dataset = MixDataset(source)
    else:
        dataset = source if isinstance(source, Dataset) else open_dataset(
            source, split, cache_dir=options.cache_dir, cache_limit=options.cache_limit, sha256=sha256)
    order = make_order(dataset, options, resolve_shard(rank, world_size))
    name, reason = choose_backend(backend, options.torch_device, remote=dataset.location.remote)
    spec = backend_spec(name)
    check_transform(options.transform, spec, workers=options.workers)
    loader = spec.loader_class()(dataset, order, options, reason=reason)
    if schedule is not None:
        loader.set_image_size(schedule)
    _announce(name, reason, dataset)
    return loader


_announced: set[tuple[str, str]] = set()


def _announce(name: str, reason: str, dataset: Dataset) -> None:
    """One INFO line a loader; the reason for the backend in full once a process (a run's train and val
    loaders, a bench's rows: the same reason each time), then its first clause."""
    short = reason.split(":")[0].split(" (")[0]
    shown = short if (name, reason) in _announced else reason
    _announced.add((name, reason))
    log.info("datapipe: %s backend (%s) over %s", name, shown, dataset)


__all__ = ["make_loader", "choose_backend", "make_order", "shard_block", "shards_held"]
