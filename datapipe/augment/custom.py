"""Your own transform, applied per record after the recipe's ops, in two forms.

- Portable (`datapipe.Transform`): `draw(rng)` returns the record's parameters from a random.Random
  seeded by the record's plan (SamplePlan.transform_seed: they depend on (seed, epoch, record) only), `apply(image, params)` applies them to
  a uint8 3 x H x W tensor. Every CPU backend honours it with the same parameters.
- Opaque: any callable on a uint8 3 x H x W tensor (a torchvision v2 or timm transform) that draws
  from Python's, NumPy's and torch's global generators. It is made deterministic per record by
  seeding all three from the record's plan around the call, which is safe only where one thread
  calls it: a backend of worker processes (or num_workers=0 with decode threads). Which backend
  honours which form is its BackendSpec.transforms (datapipe.backends.registry); make_loader refuses
  the others in one line.
"""
from __future__ import annotations

import abc
import random
from typing import Any

import numpy as np
import torch

class Transform(abc.ABC):
    """A per-record transform whose randomness the planner draws (see the module docstring)."""

    @abc.abstractmethod
    def draw(self, rng: random.Random) -> Any:
        """The record's parameters, drawn from `rng` only."""

    @abc.abstractmethod
    def apply(self, image: torch.Tensor, params: Any) -> torch.Tensor:
        """`image` (uint8 3 x H x W) transformed with `params`; uint8 3 x H x W out, the same size."""


def apply_transform(transform: Any, image: torch.Tensor, seed: int) -> torch.Tensor:
    """`image` through the user's transform, its randomness from the record's plan (its transform_seed)."""
    if isinstance(transform, Transform):
        return transform.apply(image, transform.draw(random.Random(seed)))
    py_state, np_state = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        random.seed(seed)
        np.random.seed(seed % 2**32)
        try:
            out = transform(image)
        finally:
            random.setstate(py_state)
            np.random.set_state(np_state)
    if not isinstance(out, torch.Tensor) or out.dtype != torch.uint8 or out.shape != image.shape:
        raise ValueError(f"transform {transform!r} must return a uint8 tensor of shape {tuple(image.shape)}, "
                         f"got {getattr(out, 'dtype', type(out))} {tuple(getattr(out, 'shape', ()))}")
    return out
