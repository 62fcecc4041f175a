"""Non-finite losses (inf, NaN) caught without a host sync per step.

Each step's loss is checked on the device; the count and the first bad step are read only where the
loop syncs anyway (log lines, epoch ends, checkpoints). By default a non-finite loss is an error that
names the epoch and step, so a run never ends with a silent NaN. With skip=True such losses are left
out of the averages and counted, and an optimizer step whose gradients are not finite is skipped
(that check costs one host sync per step, only with this option).
"""
from __future__ import annotations

import torch
from torch import nn

from ..errors import ExpectedError


class NonFiniteLoss(ExpectedError, FloatingPointError):
    """Training produced an inf or NaN loss (and --skip-nonfinite was not given)."""


class NonFiniteGuard:
    def __init__(self, device: torch.device, *, skip: bool) -> None:
        self.skip = skip
        self.count = torch.zeros((), dtype=torch.int64, device=device)
        self.first_step = torch.full((), -1, dtype=torch.int64, device=device)

    def observe(self, loss: torch.Tensor, step: int) -> torch.Tensor:
        """The loss to add to the epoch's sum: itself, or 0 where it is not finite (then counted)."""
        bad = ~torch.isfinite(loss)
        self.count += bad
        self.first_step = torch.where(bad & (self.first_step < 0), torch.full_like(self.first_step, step),
                                      self.first_step)
        return torch.where(bad, torch.zeros_like(loss), loss)

    def check(self, epoch: int) -> int:
        """The non-finite losses so far; raises NonFiniteLoss unless they are to be skipped."""
        count = int(self.count.item())
        if count and not self.skip:
            raise NonFiniteLoss(
                f"non-finite training loss (inf or NaN) in epoch {epoch} at step {int(self.first_step.item())}: "
                "lower --lr, try --amp bf16 or off, check the data, or pass --skip-nonfinite to skip such steps "
                "and count them")
        return count

    def step_allowed(self, model: nn.Module) -> bool:
        """With skip: whether every gradient is finite (in DDP they are averaged, so every rank agrees)."""
        if not self.skip:
            return True
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        return not grads or bool(torch.stack([torch.isfinite(g).all() for g in grads]).all())
