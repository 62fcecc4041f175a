"""The run's two loaders: the train split at the run's train sizes (a size, or a schedule over the
epochs: FFCV's ramp, a step schedule) and the val split at its eval size (FixRes: larger than train)."""
from __future__ import annotations

import logging
from typing import Any

import torch

from ..backends import Loader, make_loader
from ..formats import open_dataset
from ..mix import Mix, mix_source, source_names
from ..records import SplitNotFound
from .config import TrainConfig

log = logging.getLogger("datapipe.train")


def build_loaders(config: TrainConfig, device: torch.device) -> tuple[Loader, Loader | None]:
    """(train, val); val is None where the data has no val split."""
    common = dict(backend=config.backend, batch_size=config.batch_size, seed=config.seed,
                  num_workers=config.workers, device=str(device), channels_last=config.channels_last,
                  start_method=config.start_method, sampling=config.sampling, cache_dir=config.cache_dir,
                  cache_limit=config.cache_limit, recipe=config.recipe,  # the train view, soft targets; the eval view
                  pool_workers=config.pool_workers, pool_resources=config.pool_resources)
    # drop_last: a lone last sample breaks BatchNorm ("Expected more than 1 value per channel"),
    # as in timm and the reference ImageNet scripts; evaluation keeps every sample.
    source = mix_source(paths(config), config.weights, config.epoch_size, cache_dir=config.cache_dir,
                        cache_limit=config.cache_limit)
    # backend="ray": the train pool gives its actors back after each epoch, so that the val pool can run
    # where the train pool fills the cluster (a local Ray of few cores); the pools take turns
    train = make_loader(source, split="train", train=True, drop_last=True, image_size=config.train_sizes,
                        persistent_workers=config.backend != "ray", **common)
    log.info("image size: train %s, eval %d", config.image_size, config.eval_size)
    if train.mix is not None:
        log.info("mix: %s", "; ".join(f"{r['source']} {r['weight']:.3f} ({r['draws']} an epoch)" for r in train.mix.table(0)))
    return train, _val_loader(config, common, train.mix)


def paths(config: TrainConfig) -> list[str]:
    return [config.data] if isinstance(config.data, str) else list(config.data)


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
            found[name] = open_dataset(path, "val", cache_dir=config.cache_dir, cache_limit=config.cache_limit)
        except SplitNotFound:
            log.info("mix source %s has no val split: not evaluated", name)
    if not found:
        raise SplitNotFound("no source of the mix has a val split")
    return Mix(found, classes=mix.classes)
