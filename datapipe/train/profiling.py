"""`--profile`: a torch.profiler trace of a few steps of the first epoch, rank 0 only, in OUT/profile
(for TensorBoard's profiler plugin or Perfetto)."""
from __future__ import annotations

from pathlib import Path

import torch


def epoch_profiler(enabled: bool, device: torch.device, out: Path) -> torch.profiler.profile | None:
    """The profiler to step through an epoch (wait 1 step, warm up 1, record 3), or None when not `enabled`."""
    if not enabled:
        return None
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    return torch.profiler.profile(
        activities=activities, schedule=torch.profiler.schedule(wait=1, warmup=1, active=3, repeat=1),
        on_trace_ready=torch.profiler.tensorboard_trace_handler(str(out / "profile")))
