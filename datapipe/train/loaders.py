"""The run's two loaders: the train split at the run's train sizes (a size, or a schedule over the
epochs: FFCV's ramp, a step schedule) and the val split at its eval size (FixRes: larger than train)."""
from __future__ import annotations

import logging
from typing import Any

import torch

from ..augment.resolution import sizes_text
from ..backends import Loader, make_loader
from ..formats import open_dataset
from ..formats.base import Dataset
from ..mix.sources import Mix, mix_source, source_names
from ..records import SplitNotFound
from ..storage import redact
from .config import TrainConfig

log = logging.getLogger("datapipe.train")
MIX_SHOWN = 8  # sources the run's mix line names
WHY_LABELS = ("datapipe train trains a classifier: give it a labelled dataset (class folders, .cls members, a label "
              "column)")


def build_loaders(config: TrainConfig, device: torch.device) -> tuple[Loader, Loader | None]:
    """(train, val); val is None where the data has no val split."""
    common = dict(backend=config.backend, batch_size=config.batch_size, seed=config.seed,
                  num_workers=config.workers, device=str(device), channels_last=config.channels_last,
                  start_method=config.start_method, sampling=config.sampling, cache_dir=config.cache_dir,
                  cache_limit=config.cache_limit, recipe=config.recipe,  # the train view, soft targets; the eval view
                  pool_workers=config.pool_workers, pool_resources=config.pool_resources)
    # drop_last: a lone last sample breaks BatchNorm ("Expected more than 1 value per channel"),
    # as in timm and the reference ImageNet scripts; evaluation keeps every sample.
    source = labelled_source(config)
    # backend="ray": the train pool gives its actors back after each epoch, so that the val pool can run
    # where the train pool fills the cluster (a local Ray of few cores); the pools take turns
    train = make_loader(source, split="train", train=True, drop_last=True, image_size=config.train_sizes,
                        persistent_workers=config.backend != "ray", **common)
    log.info("image size: train %s, eval %d", sizes_text(config.image_size), config.eval_size)
    if train.mix is not None:
        log.info("mix: %s", mix_text(train.mix))
    return train, _val_loader(config, common, train.mix)


def mix_text(mix: Mix) -> str:
    """Each source's share and draws an epoch, for the run's log: the first MIX_SHOWN sources, then how
    many more (a mix of hundreds of sources was one line of ~28 characters a source)."""
    rows = mix.table(0)
    text = "; ".join(f"{r['source']} {r['weight']:.3f} ({r['draws']:,} an epoch)" for r in rows[:MIX_SHOWN])
    if len(rows) > MIX_SHOWN:
        text += f"; and {len(rows) - MIX_SHOWN} more (`datapipe info` with the run's data, --weights and --epoch-size)"
    return text


def paths(config: TrainConfig) -> list[str]:
    return [config.data] if isinstance(config.data, str) else list(config.data)


def labelled_source(config: TrainConfig) -> Dataset | Mix:
    """The train split opened (one dataset, or the mix of several), refused in one line before a loader
    starts where a dataset it draws from has no labels (no class names: its records' label is -1, which
    no classifier's loss takes). A mix's source without labels may stay at weight 0."""
    source = mix_source(paths(config), config.weights, config.epoch_size, cache_dir=config.cache_dir,
                        cache_limit=config.cache_limit)
    if not isinstance(source, Mix):
        dataset = open_dataset(source, "train", cache_dir=config.cache_dir, cache_limit=config.cache_limit)
        if not dataset.classes:
            raise ValueError(f"{redact(source)} has no labels (no class names: e.g. webdataset shards without .cls, "
                             f"Parquet without a label column); {WHY_LABELS}")
        return dataset
    weights = source.weights_at(0)
    for name, dataset, weight in zip(source.names, source.datasets, weights):
        if not dataset.classes and weight > 0:
            raise ValueError(f"mix source {name} ({redact(str(dataset.path))}) has no labels; {WHY_LABELS}, or give "
                             f"{name} weight 0 in --weights, or leave it out")
    return source


def _val_loader(config: TrainConfig, common: dict[str, Any], mix: Mix | None) -> Loader | None:
    """Evaluation is short: its DataLoader workers start per evaluation (a fork), so training does not
    run beside a second idle set of persistent workers. DALI keeps its one pipeline. Over a mix: the mix
    of the val splits its sources have (each record once), labelled in the train mix's classes."""
    try:
        source = config.data if mix is None else val_mix(mix, config)
        return make_loader(source, split="val", train=False, persistent_workers=False,
                           image_size=config.eval_size, **common)
    except SplitNotFound:
        log.info("no val split: val_acc will be null")
        return None


def val_mix(mix: Mix, config: TrainConfig) -> Mix:
    """The val splits of a train mix's sources, where they have one (SplitNotFound where none has)."""
    found = {}
    for name, path in source_names(paths(config)).items():
        try:
            dataset = open_dataset(path, "val", cache_dir=config.cache_dir, cache_limit=config.cache_limit)
        except SplitNotFound:
            log.info("mix source %s has no val split: not evaluated", name)
            continue
        if dataset.classes:
            found[name] = dataset
        else:  # its -1 labels would count as misses
            log.info("mix source %s has no labels in its val split: not evaluated", name)
    if not found:
        raise SplitNotFound("no source of the mix has a val split")
    return Mix(found, classes=mix.classes)
