"""One mixed-precision training step, written as PyTorch's AMP recipe writes it (autocast around the
forward pass and the loss; with fp16 a GradScaler around backward and the optimizer step), on the
datapipe training loop's own model. It runs on any device: on CPU for the tests, on the GPU here."""
from __future__ import annotations

import torch
from torch import nn

from .report import Result

IMAGE, BATCH, CLASSES = 32, 4, 10


def _snapshot(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def _moved(model: nn.Module, before: list[torch.Tensor]) -> bool:
    return any(not torch.equal(p.detach(), b) for p, b in zip(model.parameters(), before))


def _step(model, optimizer, scaler, images, labels, dtype, *, poison: bool = False) -> tuple[torch.Tensor, torch.dtype]:
    """Forward under autocast, scaled backward, step, update; `poison` makes every gradient inf."""
    with torch.autocast(images.device.type, dtype=dtype):
        logits = model(images)
        loss = nn.functional.cross_entropy(logits, labels)
    scaler.scale(loss * float("inf") if poison else loss).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach().float(), logits.dtype


CALIBRATION_STEPS = 24  # fp16: steps the scaler may skip (halving its 65536 start each time) before one is taken


def amp_step(device: torch.device, dtype: torch.dtype) -> Result:
    """A step must give a finite loss, run the forward pass in `dtype`, and update the weights. With
    fp16 the GradScaler may skip the first steps while its scale comes down from 65536 to one the
    gradients fit (GradScaler's backoff), but must then take a step; after a step whose gradients
    are inf it must skip the update and halve the scale (backoff_factor 0.5)."""
    from ...train.models import build_model

    check = f"amp_{'bf16' if dtype == torch.bfloat16 else 'fp16'}"
    torch.manual_seed(0)
    model = build_model("resnet18", CLASSES).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
    images = torch.randn(BATCH, 3, IMAGE, IMAGE, device=device)
    labels = torch.randint(0, CLASSES, (BATCH,), device=device)
    start = scaler.get_scale() if scaler.is_enabled() else None
    problems, skipped = [], 0
    for _ in range(CALIBRATION_STEPS if scaler.is_enabled() else 1):
        before = _snapshot(model)
        loss, computed = _step(model, optimizer, scaler, images, labels, dtype)
        if _moved(model, before):
            break
        skipped += 1
    values = {"loss": round(float(loss), 4), "autocast_dtype": str(computed).replace("torch.", ""), "skipped": skipped}
    if not torch.isfinite(loss):
        problems.append(f"the loss is {float(loss)}")
    if computed != dtype:
        problems.append(f"the forward pass ran in {computed}, not {dtype}: autocast did not apply")
    if skipped == CALIBRATION_STEPS or (skipped and not scaler.is_enabled()):
        problems.append(f"no optimizer step changed the weights in {skipped} steps")
    figure = f"loss {float(loss):.3f}, forward in {values['autocast_dtype']}"
    if scaler.is_enabled():
        problems += _scaler_skips_inf(model, optimizer, scaler, images, labels, dtype, values)
        figure += (f", scale {start:g} -> {values['scale']:g} ({skipped} skipped), "
                   f"-> {values['scale_after_inf']:g} on inf")
    if problems:
        return Result(check, "fail", figure, "; ".join(problems), values)
    return Result(check, "pass", figure, values=values)


def _scaler_skips_inf(model, optimizer, scaler, images, labels, dtype, values: dict) -> list[str]:
    """One step with inf gradients: the weights must stay, the scale must halve."""
    kept, before = scaler.get_scale(), _snapshot(model)
    _step(model, optimizer, scaler, images, labels, dtype, poison=True)
    values.update(scale=kept, scale_after_inf=scaler.get_scale())
    problems = []
    if _moved(model, before):
        problems.append("a step with inf gradients changed the weights (GradScaler must skip it)")
    if scaler.get_scale() != kept * 0.5:
        problems.append(f"after inf gradients the scale is {scaler.get_scale()}, not {kept * 0.5}")
    return problems
