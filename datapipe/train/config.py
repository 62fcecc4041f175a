"""Training options (validated once) and the warm-up + cosine learning-rate schedule."""
from __future__ import annotations

import math
from dataclasses import dataclass

AMP_MODES = ("bf16", "fp16", "off")
# What defines a run's course: a resume from the command line keeps the checkpoint's values of these
# unless they are given again (datapipe.train.checkpoint.run_settings); the Trainer follows its config.
RUN_SETTINGS = ("model", "epochs", "batch_size", "lr", "momentum", "weight_decay", "label_smoothing",
                "warmup_epochs", "image_size", "amp", "accum_steps", "seed", "skip_nonfinite",
                "checkpoint_activations", "channels_last")


@dataclass(frozen=True)
class TrainConfig:
    """Everything `datapipe train` takes; `amp=None` picks bf16 on GPUs that support it, else off."""

    data: str
    out: str
    model: str = "resnet50"
    epochs: int = 1
    batch_size: int = 256
    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 1e-4
    label_smoothing: float = 0.1
    warmup_epochs: float = 1.0
    image_size: int = 224
    backend: str = "auto"
    amp: str | None = None
    accum_steps: int = 1
    compile: bool = False
    checkpoint_activations: bool = False
    channels_last: bool = True
    profile: bool = False
    resume: str | None = None
    workers: int | None = None
    seed: int = 0
    log_every: int = 50
    save_every: int = 0
    max_steps: int | None = None
    skip_nonfinite: bool = False
    start_method: str | None = None
    sampling: str = "auto"  # "shards" for remote datasets by default (datapipe.sharding.ShardPlan)
    cache_dir: str | None = None  # where a remote dataset's shards are cached
    cache_limit: int | None = None  # bytes the cache may hold
    tensorboard: str = "auto"  # a folder, "auto" (OUT/tensorboard when installed) or "off" (datapipe.train.board)

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size", "accum_steps", "image_size", "log_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.lr <= 0 or self.warmup_epochs < 0 or self.save_every < 0:
            raise ValueError("lr must be > 0; warmup_epochs and save_every must be >= 0")
        if self.amp is not None and self.amp not in AMP_MODES:
            raise ValueError(f"amp must be one of {AMP_MODES}, got {self.amp!r}")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {self.max_steps}")


def warmup_cosine(step: int, *, warmup: int, total: int) -> float:
    """LR multiplier: linear warm-up over `warmup` steps, then cosine decay to 0 at `total`."""
    if step < warmup:
        return (step + 1) / warmup
    if total <= warmup:
        return 1.0
    progress = min(1.0, (step - warmup) / (total - warmup))
    return 0.5 * (1 + math.cos(math.pi * progress))
