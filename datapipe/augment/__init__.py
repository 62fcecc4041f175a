"""Training recipes: declared once (Recipe, the presets), planned per record in one place (plan),
applied by every backend (cpu.py; the DALI graph), mixed on the output device (batch.py).
May import image and the leaves (errors, checks)."""
from __future__ import annotations

from .batch_plan import plan_erase
from .plan import SamplePlan, plan_sample
from .recipe import PRESETS, Recipe, parse_auto_augment, resolve_recipe
from .resolution import SizeRamp

__all__ = ["Recipe", "PRESETS", "resolve_recipe", "parse_auto_augment", "plan_sample", "plan_erase", "SamplePlan",
           "SizeRamp"]
