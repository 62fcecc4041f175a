"""Training options (validated once) and the warm-up + cosine learning-rate schedule.

Label smoothing, one value per run, applied in one place (the same targets either way: torch's
CrossEntropyLoss(label_smoothing=s) on integer labels is soft-target cross-entropy on timm's
smoothed one-hots, off = s / classes, on = 1 - s + off):
- the recipe makes soft targets (mixup, cutmix or its own `label_smoothing` > 0, `--smoothing`):
  the smoothing is in the targets (the recipe's), and the loss does not smooth them again;
- otherwise the loader yields integer labels and the loss smooths them by `label_smoothing`
  (`--label-smoothing`, 0.1 when unset: the loop's historical default, so old command lines train
  as before). Giving both a `label_smoothing` and a soft-target recipe with another value is an error.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

from ..augment.recipe import PRESETS, Recipe, preset_sizes, resolve_recipe
from ..augment.resolution import SizeSteps, check_image_size, last_size, run_sizes, size_steps
from ..checks import MAX_SEED, integer, real
from .models import resolve_model

AMP_MODES = ("bf16", "fp16", "off")
# Per optimizer: (lr, weight_decay) when not given. SGD: the loop's historical values (Goyal et al.);
# AdamW: DeiT's weight decay with an lr that suits batches of a few hundred.
OPTIMIZERS = {"sgd": (0.1, 1e-4), "adamw": (1e-3, 0.05)}
HARD_LABEL_SMOOTHING = 0.1  # the loss's smoothing of integer labels when label_smoothing is unset
# What defines a run's course: a resume from the command line keeps the checkpoint's values of these
# unless they are given again (datapipe.train.checkpoint.run_settings); the Trainer follows its config.
RUN_SETTINGS = ("model", "epochs", "batch_size", "lr", "momentum", "weight_decay", "label_smoothing",
                "warmup_epochs", "image_size", "eval_size", "amp", "accum_steps", "seed", "skip_nonfinite",
                "checkpoint_activations", "channels_last", "recipe", "opt", "model_ema", "model_ema_decay",
                "warmup_lr", "min_lr")


def as_recipe(value: "Recipe | str | dict[str, Any] | None") -> Recipe:
    """A Recipe from a Recipe, a preset name, a checkpoint's dict (Recipe.to_dict) or None (the default)."""
    if isinstance(value, dict):
        return Recipe.from_dict(value)
    return resolve_recipe(value)


@dataclass(frozen=True)
class TrainConfig:
    """Everything `datapipe train` takes; `amp=None` picks bf16 on GPUs that support it, else off.
    `lr` and `weight_decay` left None take the optimizer's defaults (OPTIMIZERS); `recipe` is a
    datapipe.Recipe or a preset name (datapipe.augment.PRESETS)."""

    data: Any  # a path, or several: their mix (datapipe.Mix, named by mix.source_names) with weights, epoch_size
    out: str
    model: str = "resnet50"
    epochs: int = 1
    batch_size: int = 256
    opt: str = "sgd"
    lr: float | None = None
    momentum: float = 0.9
    weight_decay: float | None = None
    label_smoothing: float | None = None  # integer labels only: see the module's docstring
    warmup_epochs: float = 1.0
    warmup_lr: float = 0.0  # the warm-up rises linearly from here to lr
    min_lr: float = 0.0  # the cosine ends here
    recipe: Recipe = PRESETS["default"]
    model_ema: bool = False
    model_ema_decay: float = 0.9998
    # None: the recipe's preset sizes (PRESET_SIZES). A size, "MIN:MAX" (FFCV's ramp over the run), {epoch: size}
    # or a list of sizes, one an epoch (datapipe.augment.resolution.run_sizes); kept as an int or {epoch: size}.
    image_size: Any = None
    eval_size: int | None = None  # None: the preset's eval size with its train sizes, else the last train size
    backend: str = "auto"
    amp: str | None = None
    accum_steps: int = 1
    compile: bool = False
    checkpoint_activations: bool = False
    channels_last: bool = True
    profile: bool = False
    resume: str | None = None
    workers: int | None = None
    pool_workers: Any = None  # backend ray: actors per rank's pool, "auto" or None (workers's value)
    pool_resources: Any = None  # backend ray: Ray resources each actor asks for, (name, amount) pairs
    seed: int = 0
    log_every: int = 50
    save_every: int = 0
    max_steps: int | None = None
    skip_nonfinite: bool = False
    start_method: str | None = None
    sampling: str = "auto"  # "shards" for remote datasets by default (datapipe.order.sharding.ShardOrder)
    cache_dir: str | None = None  # where a remote dataset's shards are cached
    cache_limit: int | None = None  # bytes the cache may hold
    tensorboard: str = "auto"  # a folder, "auto" (OUT/tensorboard when installed) or "off" (datapipe.train.board)
    weights: Any = None  # several datasets: each one's weight, in order (None: their sizes)
    epoch_size: int | None = None  # several datasets: samples an epoch (None: the sum of their sizes)

    def __post_init__(self) -> None:
        self._check_numbers()
        object.__setattr__(self, "model", resolve_model(self.model))  # an alias as its name; timm/NAME installed
        if self.opt not in OPTIMIZERS:
            raise ValueError(f"opt must be one of {sorted(OPTIMIZERS)}, got {self.opt!r}")
        lr, weight_decay = OPTIMIZERS[self.opt]
        object.__setattr__(self, "lr", lr if self.lr is None else self.lr)
        object.__setattr__(self, "weight_decay", weight_decay if self.weight_decay is None else self.weight_decay)
        object.__setattr__(self, "recipe", as_recipe(self.recipe))
        self._resolve_sizes()
        if not 0 <= self.min_lr <= self.lr or not 0 <= self.warmup_lr <= self.lr:
            raise ValueError(f"min_lr ({self.min_lr}) and warmup_lr ({self.warmup_lr}) must be within 0..lr ({self.lr})")
        if self.amp is not None and self.amp not in AMP_MODES:
            raise ValueError(f"amp must be one of {AMP_MODES}, got {self.amp!r}")
        self._check_smoothing()

    def _check_numbers(self) -> None:
        """The numeric options, each of its type (a bool is not a number), finite, within its range
        (datapipe.checks), before anything is built: a bad value fails at the start, not at an epoch's end."""
        for name in ("epochs", "batch_size", "accum_steps", "log_every"):
            integer(name, getattr(self, name), 1)
        integer("seed", self.seed, 0, MAX_SEED)
        for name, low in (("save_every", 0), ("max_steps", 1), ("workers", 0), ("epoch_size", 1)):
            if getattr(self, name) is not None:
                integer(name, getattr(self, name), low)
        if self.lr is not None:
            real("lr", self.lr, 0, low_open=True)
        if self.weight_decay is not None:
            real("weight_decay", self.weight_decay, 0)
        for name in ("warmup_epochs", "warmup_lr", "min_lr"):
            real(name, getattr(self, name), 0)
        real("momentum", self.momentum, 0, 1, high_open=True)
        real("model_ema_decay", self.model_ema_decay, 0, 1, high_open=True, note=" (timm's default: 0.9998)")
        if self.label_smoothing is not None:
            real("label_smoothing", self.label_smoothing, 0, 1, high_open=True)
        if self.cache_limit is not None:
            real("cache_limit", self.cache_limit, 1, note=" (bytes the shard cache may hold) or None")

    def _resolve_sizes(self) -> None:
        """image_size as plain data (an int or {first epoch: size}: a resume serves the same sizes whatever
        its --epochs), eval_size as an int (FixRes: a preset may evaluate larger than it trains)."""
        preset = preset_sizes(self.recipe)
        given = self.image_size is not None
        sizes = run_sizes(self.image_size if given else preset.train, self.epochs)
        object.__setattr__(self, "image_size", sizes)
        default = preset.eval if not given and preset.eval is not None else last_size(sizes)
        object.__setattr__(self, "eval_size", check_image_size(default if self.eval_size is None else self.eval_size,
                                                               "eval_size"))

    @property
    def train_sizes(self) -> "int | SizeSteps":
        """What the train loader takes as image_size: the size, or the schedule (a function of the epoch)."""
        return size_steps(self.image_size)

    def _check_smoothing(self) -> None:
        if (self.label_smoothing is not None and self.recipe.soft_targets
                and self.label_smoothing != self.recipe.label_smoothing):
            raise ValueError(
                f"label_smoothing={self.label_smoothing} smooths integer labels in the loss, but recipe "
                f"{self.recipe.name!r} makes soft targets that carry its own smoothing "
                f"({self.recipe.label_smoothing}) and are not smoothed again: set the recipe's instead "
                f"(--smoothing {self.label_smoothing}, or Recipe label_smoothing=) and leave label_smoothing unset")

    @property
    def loss_smoothing(self) -> float:
        """What the loss smooths integer labels by (soft targets are never smoothed again)."""
        return HARD_LABEL_SMOOTHING if self.label_smoothing is None else self.label_smoothing

    def record(self) -> dict[str, Any]:
        """Plain values (a checkpoint's `config`, loadable with weights_only): the recipe as a dict."""
        return {**{f.name: getattr(self, f.name) for f in fields(self)}, "recipe": self.recipe.to_dict()}


def hparams(config: TrainConfig) -> dict[str, Any]:
    """The run's settings and its recipe's fields (`recipe/...`), flat, for TensorBoard's hparams."""
    record = config.record()
    found: dict[str, Any] = {name: record[name] for name in RUN_SETTINGS if name != "recipe"}
    found["recipe"] = config.recipe.name
    found.update({f"recipe/{k}": v for k, v in record["recipe"].items() if k != "name"})
    return found


def warmup_cosine(step: int, *, warmup: int, total: int, start: float = 0.0, floor: float = 0.0) -> float:
    """LR multiplier: linear warm-up over `warmup` steps from `start` (a share of lr), then cosine
    decay to `floor` (a share of lr) at `total`. start = floor = 0: the loop's historical schedule."""
    if step < warmup:
        return start + (1 - start) * (step + 1) / warmup
    if total <= warmup:
        return 1.0
    progress = min(1.0, (step - warmup) / (total - warmup))
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))
