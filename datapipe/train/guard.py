"""Non-finite losses (inf, NaN) and skipped optimizer steps, counted without a host sync per step.

Each step's loss is checked on the device; the count and the first bad step are read only where the
loop syncs anyway (log lines, epoch ends, checkpoints), summed over ranks there: every rank checks at
the same points and sees the same totals, so every rank raises the same error or none does (a rank
raising alone would leave the others blocked in their next collective). By default a non-finite loss
is an error that names the epoch and step, so a run never ends with a silent NaN. With skip=True such losses are left
out of the averages and counted. An optimizer step whose gradients are not finite is skipped and
counted: with fp16 the GradScaler decides (always, as fp16 needs); with bf16/fp32 and skip=True the
guard checks the gradients itself (one host sync per step, only with this option).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from ..errors import ExpectedError


class NonFiniteLoss(ExpectedError, FloatingPointError):
    """Training produced an inf or NaN loss (and --skip-nonfinite was not given)."""


class NonFiniteGuard:
    def __init__(self, device: torch.device, *, skip: bool) -> None:
        self.skip = skip
        self.count = torch.zeros((), dtype=torch.int64, device=device)
        self.first_step = torch.full((), -1, dtype=torch.int64, device=device)
        self.skipped = torch.zeros((), dtype=torch.int64, device=device)  # optimizer steps not taken
        self.agreed = 0  # the count over all ranks at the last check (readable without a collective)

    def observe(self, loss: torch.Tensor, step: int) -> torch.Tensor:
        """The loss to add to the epoch's sum: itself, or 0 where it is not finite (then counted)."""
        bad = ~torch.isfinite(loss)
        self.count += bad
        self.first_step = torch.where(bad & (self.first_step < 0), torch.full_like(self.first_step, step),
                                      self.first_step)
        return torch.where(bad, torch.zeros_like(loss), loss)

    def check(self, epoch: int) -> int:
        """The non-finite losses so far on all ranks; raises NonFiniteLoss unless they are to be skipped.
        A collective in a process group: every rank calls it at the same points."""
        count, first = self._over_ranks()
        self.agreed = count
        if count and not self.skip:
            raise NonFiniteLoss(
                f"non-finite training loss (inf or NaN) in epoch {epoch} at step {first}: "
                "lower --lr, try --amp bf16 or off, check the data, or pass --skip-nonfinite to skip such steps "
                "and count them")
        return count

    def _over_ranks(self) -> tuple[int, int]:
        """(count summed over ranks, first bad step: the lowest any rank saw)."""
        count = self.count.clone()
        never = torch.iinfo(torch.int64).max
        first = torch.where(self.first_step < 0, torch.full_like(self.first_step, never), self.first_step)
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(count)
            dist.all_reduce(first, op=dist.ReduceOp.MIN)
        return int(count.item()), int(first.item())

    def step(self, scaler: torch.amp.GradScaler, optimizer: torch.optim.Optimizer, model: nn.Module) -> None:
        """One optimizer step, or none where the gradients are not finite (then counted in `skipped`).

        fp16 (scaler enabled): GradScaler.step skips such a step itself, and update() fails unless
        step() ran, so both always run. A skip shows as the scale going down (update multiplies it by
        backoff_factor < 1, see GradScaler.update; a scale that underflowed to 0 skips every step):
        compared on the device through the scale tensor (_get_scale_async; get_scale() would sync).
        bf16/fp32: with skip, the guard's own gradient check.
        """
        if scaler.is_enabled():
            before = scaler._get_scale_async().clone()
            scaler.step(optimizer)
            scaler.update()
            after = scaler._get_scale_async()
            self.skipped += (after < before) | (after == 0)
        elif self.step_allowed(model):
            optimizer.step()
        else:
            self.skipped += 1

    def step_allowed(self, model: nn.Module) -> bool:
        """With skip: whether every gradient is finite (in DDP they are averaged, so every rank agrees).
        For unscaled gradients (bf16, fp32): fp16 ones are scaled, and the GradScaler checks those."""
        if not self.skip:
            return True
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        return not grads or bool(torch.stack([torch.isfinite(g).all() for g in grads]).all())
