"""datapipe: pack image folders into LMDB / HDF5 / WebDataset and feed PyTorch training at full speed.

The loaders (and torch with them) are imported on first use, so `datapipe convert`, `info` and
`verify`, which need no torch, start in a fraction of a second.
"""
from __future__ import annotations

import importlib
from typing import Any

from .formats import open_dataset, read_manifest
from .records import ClassIndex, Manifest, Record, Sample, SplitNotFound

__version__ = "0.1.0"
_LAZY = {"make_loader": ".backends", "Batch": ".backends", "Loader": ".backends", "LoaderOptions": ".backends",
         "batch_type": ".backends",
         "BadSample": ".backends.bad_samples", "TooManyBadSamples": ".backends.bad_samples",
         "Recipe": ".augment", "PRESETS": ".augment", "SizeRamp": ".augment", "Transform": ".augment.custom",
         "Mix": ".mix", "Source": ".mix"}
__all__ = ["make_loader", "Batch", "batch_type", "Loader", "LoaderOptions", "BadSample", "TooManyBadSamples", "Recipe",
           "PRESETS", "SizeRamp", "Transform", "Mix", "Source", "open_dataset",
           "read_manifest", "Sample", "Record", "SplitNotFound", "Manifest", "ClassIndex", "__version__"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'datapipe' has no attribute {name!r}")
