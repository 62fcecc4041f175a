"""The optimizer (`--opt sgd|adamw`) and its parameter groups.

Weight decay only on weights of more than one dimension (convolutions, linear layers): none on
biases and normalization weights, for both optimizers, nor on what the model's no_weight_decay()
names (a ViT's position table and class token), as timm's param_groups_weight_decay."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .config import TrainConfig


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """[decayed weights, the rest (biases, norm weights, no_weight_decay()) without decay], in parameter order."""
    decay, rest = [], []
    exempt = set(getattr(model, "no_weight_decay", set)())
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        (rest if param.ndim <= 1 or name.endswith(".bias") or name in exempt else decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]


def build_optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.Optimizer:
    """SGD with (non-Nesterov) momentum, or AdamW (betas 0.9, 0.999; eps 1e-8: torch's and timm's)."""
    groups = param_groups(model, config.weight_decay)
    if config.opt == "adamw":
        return torch.optim.AdamW(groups, lr=config.lr)
    return torch.optim.SGD(groups, lr=config.lr, momentum=config.momentum)
