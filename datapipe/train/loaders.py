"""The run's two loaders: the train split at the run's train sizes (a size, or a schedule over the
epochs: FFCV's ramp, a step schedule) and the val split at its eval size (FixRes: larger than train)."""
from __future__ import annotations

import logging
from typing import Any

import torch

from ..backends import Loader, make_loader
from ..records import SplitNotFound
from .config import TrainConfig

log = logging.getLogger("datapipe.train")


def build_loaders(config: TrainConfig, device: torch.device) -> tuple[Loader, Loader | None]:
    """(train, val); val is None where the data has no val split."""
    common = dict(backend=config.backend, batch_size=config.batch_size, seed=config.seed,
                  num_workers=config.workers, device=str(device), channels_last=config.channels_last,
                  start_method=config.start_method, sampling=config.sampling, cache_dir=config.cache_dir,
                  cache_limit=config.cache_limit, recipe=config.recipe)  # the train view, soft targets; the eval view
    # drop_last: a lone last sample breaks BatchNorm ("Expected more than 1 value per channel"),
    # as in timm and the reference ImageNet scripts; evaluation keeps every sample.
    train = make_loader(config.data, split="train", train=True, drop_last=True, image_size=config.train_sizes, **common)
    log.info("image size: train %s, eval %d", config.image_size, config.eval_size)
    return train, _val_loader(config, common)


def _val_loader(config: TrainConfig, common: dict[str, Any]) -> Loader | None:
    """Evaluation is short: its DataLoader workers start per evaluation (a fork), so training does not
    run beside a second idle set of persistent workers. DALI keeps its one pipeline."""
    try:
        return make_loader(config.data, split="val", train=False, persistent_workers=False,
                           image_size=config.eval_size, **common)
    except SplitNotFound:
        log.info("no val split: val_acc will be null")
        return None
