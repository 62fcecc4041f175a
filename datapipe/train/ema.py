"""An exponential moving average of the model's weights (timm's ModelEmaV2, `--model-ema`).

    ema = decay * ema + (1 - decay) * model

after every optimizer step, for every parameter and floating-point buffer (BatchNorm's running
statistics too, as timm's ModelEmaV2); integer buffers (num_batches_tracked) are copied. The copy
starts as the model itself when it is made, so the first update already follows the formula (torch's
AveragedModel instead copies the model on its first update). It lives on the model's device, is
saved in last.pt as `model_ema`, and is evaluated beside the model (`ema_val_acc`)."""
from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn


class ModelEma:
    """The averaged copy of `model` (`.module`, in eval mode, no gradients)."""

    def __init__(self, model: nn.Module, decay: float) -> None:
        if not 0 <= decay < 1:
            raise ValueError(f"model_ema_decay must be within [0, 1), got {decay} (timm's default: 0.9998)")
        self.decay = decay
        self.module = copy.deepcopy(model).eval()
        self.module.requires_grad_(False)

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        """One step of the average towards `model`'s current weights (no host sync)."""
        averaged, current = [], []
        ours = self.module.state_dict()
        for name, tensor in model.state_dict().items():
            if tensor.is_floating_point():
                averaged.append(ours[name])
                current.append(tensor.detach())
            else:
                ours[name].copy_(tensor)
        if averaged:
            torch._foreach_lerp_(averaged, current, 1.0 - self.decay)

    def state_dict(self) -> dict[str, Any]:
        return self.module.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.module.load_state_dict(state)
