"""`DIR/last.pt`: model, optimizer, scaler, schedule, loader position and partial-epoch sums.

Written by rank 0 only, atomically (temp file + rename), at optimizer-step boundaries, so a resume
never sees half a checkpoint or half-accumulated gradients. Read with weights_only=True: a
checkpoint holds tensors and plain values, never code.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import torch

from .config import RUN_SETTINGS


def save(path: Path, state: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def load(path: str | Path, *, mmap: bool = False) -> dict[str, Any]:
    """The checkpoint's state; mmap=True reads tensors only where they are used."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}; --resume takes the last.pt that a run wrote into its --out")
    return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)


def run_settings(path: str | Path) -> dict[str, Any]:
    """The RUN_SETTINGS a checkpoint's run had (its tensors are memory-mapped, not read)."""
    saved = load(path, mmap=True).get("config", {})
    return {name: saved[name] for name in RUN_SETTINGS if name in saved}


def weights_digest(model: torch.nn.Module) -> str:
    """sha256 over every parameter and buffer, in order: equal on ranks that hold the same weights."""
    h = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        h.update(name.encode())
        h.update(tensor.detach().float().cpu().numpy().tobytes())
    return h.hexdigest()
