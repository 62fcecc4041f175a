"""The loaders: `make_loader` (make.py), the Loader protocol (base.py), the registry of backends by name
(registry.py), one module or package a backend. May import every room but cli, doctor, bench and train.

Importing the package costs no torch: the registry is read by the CLI's parser; make_loader and the rest
load on first use, as datapipe's own names do."""
from __future__ import annotations

import importlib
from typing import Any

from .registry import (BackendSpec, Situation, backend_choices, backend_names, backend_spec, dali_installed,
                       register_backend, unregister_backend)

_LAZY = {"make_loader": ".make", "choose_backend": ".make", "make_order": ".make", "shard_block": ".make",
         "shards_held": ".make", "_announced": ".make", "Batch": ".base", "Loader": ".base",
         "batch_type": ".base", "LoaderOptions": ".options"}


def __getattr__(name: str) -> Any:
    if name == "BACKENDS":  # read from the registry each time: a backend registered later is in it
        return backend_choices()
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'datapipe.backends' has no attribute {name!r}")


__all__ = ["make_loader", "choose_backend", "Batch", "Loader", "LoaderOptions", "BACKENDS", "batch_type",
           "BackendSpec", "Situation", "register_backend", "unregister_backend", "backend_names", "backend_choices",
           "backend_spec", "dali_installed"]
