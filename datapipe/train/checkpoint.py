"""`DIR/last.pt`: model (and its EMA), optimizer, scaler, schedule, loader position, partial-epoch
sums, and the run's config with its augmentation recipe.

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

from ..augment.recipe import PRESETS, Recipe
from .config import RUN_SETTINGS, TrainConfig, as_recipe


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
    """The RUN_SETTINGS a checkpoint's run had (its tensors are memory-mapped, not read); the recipe
    as a Recipe."""
    state = load(path, mmap=True)
    saved = state.get("config", {})
    found = {name: saved[name] for name in RUN_SETTINGS if name in saved}
    found["recipe"] = saved_recipe(state)
    return found


def saved_recipe(state: dict[str, Any]) -> Recipe:
    """The recipe a checkpoint's run trained with: its config's, else its loader's, else (checkpoints
    older than recipes) the loader's historical view, the default."""
    for part in (state.get("config", {}), state.get("loader", {})):
        if part.get("recipe") is not None:
            return as_recipe(part["recipe"])
    return PRESETS["default"]


def refuse_another_course(state: dict[str, Any], config: TrainConfig) -> None:
    """A resume continues the run it was saved from: another recipe or optimizer is refused (one
    line, before anything is loaded)."""
    recipe = saved_recipe(state)
    if recipe != config.recipe:
        raise ValueError(f"cannot resume from {config.resume}: it was trained with recipe {recipe.name!r}, this run "
                         f"asks for {config.recipe.name!r} ({recipe.describe_difference(config.recipe)}); resume with "
                         "the recipe it was saved with (leave out --recipe and the recipe flags) or start a new --out")
    opt = state.get("config", {}).get("opt", "sgd")
    if opt != config.opt:
        raise ValueError(f"cannot resume from {config.resume}: it was trained with --opt {opt}, this run asks for "
                         f"--opt {config.opt} (their optimizer states differ); resume with --opt {opt} or start a new --out")


def weights_digest(model: torch.nn.Module) -> str:
    """sha256 over every parameter and buffer, in order: equal on ranks that hold the same weights."""
    h = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        h.update(name.encode())
        h.update(tensor.detach().float().cpu().numpy().tobytes())
    return h.hexdigest()
