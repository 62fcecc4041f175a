"""The backends by name: each one's loader class and what `backend="auto"` weighs, in one table.

make_loader, choose_backend, BACKENDS and the CLI's --backend/--backends choices all read it. Adding a
backend is one module (a Loader subclass) plus one `register_backend(BackendSpec(...))`. Kept free of
torch: the CLI builds its parser from it, and `convert`, `info`, `verify` never import torch.
"""
from __future__ import annotations

import importlib
import importlib.util
import re
from dataclasses import dataclass
from typing import Callable

from ..checks import shown


@dataclass(frozen=True)
class Situation:
    """What `auto` knows when it chooses: the device's type ("cuda", "cpu", ...) and whether the
    dataset is read from an object store."""

    device: str
    remote: bool = False


TRANSFORMS = ("any", "portable", "none")  # BackendSpec.transforms' values
NAME_MAX = 200  # characters of BackendSpec.requires and .extra at most
EXTRA = re.compile(r"([A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?)?")  # a pip extra's name (PEP 685), or ''



@dataclass(frozen=True)
class BackendSpec:
    """One backend. `loader`: its Loader class, or "module:Class" (under datapipe.backends when the
    module starts with a dot) imported on first use, so that naming a backend costs no import.
    `auto`: the reason `backend="auto"` picks it in a situation, or None where it does not; auto asks
    the backends in `auto_rank` order, lowest first (None: never chosen by auto, named only).
    `transforms`: the user's `transform=` it honours per record: "any" callable (one thread calls it
    in each process), "portable" (a datapipe.Transform only; any callable too with num_workers=0 where
    `inline_without_workers`: the caller's thread decodes) or "none" (no Python runs per sample).
    `requires`: a module it needs beyond datapipe's core, installed by the pip extra `extra`.
    `preview`: in `datapipe preview`'s default rows (a backend auto may choose only)."""

    name: str
    loader: "type | str"
    auto: Callable[[Situation], str | None] | None = None
    auto_rank: int = 100
    summary: str = ""
    transforms: str = "portable"
    inline_without_workers: bool = False
    requires: str = ""
    extra: str = ""
    preview: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.isidentifier() or self.name == "auto":
            raise ValueError(f"a backend's name must be an identifier other than 'auto', got {self.name!r}")
        named = isinstance(self.loader, str) and all(
            part.isidentifier() for part in [*self.loader.partition(":")[0].lstrip(".").split("."),
                                             self.loader.partition(":")[2]])
        if not (isinstance(self.loader, type) or named):
            raise ValueError(f"backend {self.name!r}: loader must be a Loader subclass or 'module:Class' (a module "
                             f"under datapipe.backends when it starts with a dot), got {shown(self.loader)}")
        if self.auto is not None and not callable(self.auto):
            raise ValueError(f"backend {self.name!r}: auto must be a function of the Situation (a reason, or None), "
                             f"got {shown(self.auto)}")
        if type(self.auto_rank) is not int:
            raise ValueError(f"backend {self.name!r}: auto_rank must be an int, got {shown(self.auto_rank)}")
        for flag, value in (("inline_without_workers", self.inline_without_workers), ("preview", self.preview)):
            if type(value) is not bool:
                raise ValueError(f"backend {self.name!r}: {flag} must be True or False, got {shown(value)}")
        if self.transforms not in TRANSFORMS:
            raise ValueError(f"backend {self.name!r}: transforms must be one of {TRANSFORMS}, "
                             f"got {shown(self.transforms)}")
        if not isinstance(self.requires, str) or len(self.requires) > NAME_MAX or (self.requires and not all(
                part.isidentifier() for part in self.requires.split("."))):
            raise ValueError(f"backend {self.name!r}: requires must be a module's dotted name or '', "
                             f"got {shown(self.requires)}")
        if not isinstance(self.extra, str) or len(self.extra) > NAME_MAX or not EXTRA.fullmatch(self.extra):
            raise ValueError(f"backend {self.name!r}: extra must be a pip extra's name (letters, digits, '-', '_', "
                             f"'.') or '', got {shown(self.extra)}")

    def installed(self) -> bool:
        """Whether the module it requires (if any) can be imported here."""
        return not self.requires or module_installed(self.requires)

    def install_hint(self) -> str:
        """How to install what it requires: "pip install 'datapipe[EXTRA]'" (or the module's name)."""
        return f"pip install 'datapipe[{self.extra}]'" if self.extra else f"install {self.requires}"

    def loader_class(self) -> type:
        """The Loader subclass, imported now when named "module:Class"; a ValueError naming the backend
        when its module or class is not there or the class is not a Loader (torch is imported here)."""
        from .base import Loader

        found: object = self.loader
        if isinstance(self.loader, str):
            module, _, attribute = self.loader.partition(":")
            full = importlib.util.resolve_name(module, "datapipe.backends")
            try:
                found = getattr(importlib.import_module(full), attribute)
            except ModuleNotFoundError as exc:
                if exc.name is None or not (full == exc.name or full.startswith(exc.name + ".")):
                    raise  # the module is there; something it imports is not (DALI, Ray): that error's words
                raise ValueError(f"backend {self.name!r}: its loader's module {full!r} is not installed "
                                 f"(loader={self.loader!r})") from None
            except AttributeError:
                raise ValueError(f"backend {self.name!r}: module {full!r} has no {attribute!r} "
                                 f"(loader={self.loader!r})") from None
        if not (isinstance(found, type) and issubclass(found, Loader)):
            raise ValueError(f"backend {self.name!r}: its loader {shown(found)} is not a subclass of "
                             "datapipe.backends.base.Loader")
        return found


_BACKENDS: dict[str, BackendSpec] = {}


def register_backend(spec: BackendSpec, *, replace: bool = False) -> BackendSpec:
    """Add `spec` to the table (make_loader and the CLI offer it from now on); a name taken is refused
    unless `replace`."""
    if spec.name in _BACKENDS and not replace:
        raise ValueError(f"a backend named {spec.name!r} is registered already; pass replace=True to replace it")
    _BACKENDS[spec.name] = spec
    return spec


def unregister_backend(name: str) -> None:
    _BACKENDS.pop(name, None)


def backend_names() -> tuple[str, ...]:
    """The registered backends, in registration order."""
    return tuple(_BACKENDS)


def backend_choices() -> tuple[str, ...]:
    """What make_loader's `backend=` and `datapipe train --backend` accept: "auto" and every name."""
    return ("auto", *_BACKENDS)


def local_backends() -> tuple[str, ...]:
    """The backends that run on this machine alone: those `auto` may choose (ray's pool is named only)."""
    return tuple(name for name, spec in _BACKENDS.items() if spec.auto is not None)


def preview_backends() -> tuple[str, ...]:
    """`datapipe preview`'s default rows: the local backends marked `preview`."""
    return tuple(name for name in local_backends() if _BACKENDS[name].preview)


def transform_backends(kind: str) -> tuple[str, ...]:
    """The backends whose `transforms` is `kind` or more ("portable" includes those honouring "any")."""
    accepted = TRANSFORMS[:TRANSFORMS.index(kind) + 1]
    return tuple(name for name, spec in _BACKENDS.items() if spec.transforms in accepted)


def backend_spec(name: str) -> BackendSpec:
    if name not in _BACKENDS:
        raise ValueError(f"unknown backend {name!r}; choose one of {backend_choices()}")
    return _BACKENDS[name]


def module_installed(name: str) -> bool:
    """Whether the module `name` (dotted) can be found; finding a submodule imports its parent packages
    (nvidia, a namespace, for nvidia.dali), and a parent that fails to import counts as not installed."""
    parts = name.split(".")
    try:
        return all(importlib.util.find_spec(".".join(parts[:n])) is not None for n in range(1, len(parts) + 1))
    except Exception:  # noqa: BLE001 - a parent whose import raises, or a module that is no package
        return False


def dali_installed() -> bool:
    return backend_spec("dali").installed()


def choose(backend: str, situation: Situation) -> tuple[str, str]:
    """(backend name, why) for a requested name or "auto": the first backend, by auto_rank, whose rule
    gives a reason in this situation."""
    if backend != "auto":
        return backend_spec(backend).name, "requested"
    for spec in sorted((s for s in _BACKENDS.values() if s.auto is not None), key=lambda s: s.auto_rank):
        try:
            reason = spec.auto(situation)  # type: ignore[misc]
        except Exception as exc:  # noqa: BLE001 - a registered rule's own bug, named
            raise ValueError(f"backend {spec.name!r}: its auto rule raised {shown(exc)} for {situation}; fix the "
                             "rule, or name a backend") from exc
        if reason is not None and not isinstance(reason, str):
            raise ValueError(f"backend {spec.name!r}: its auto rule gave {shown(reason)} for {situation}; it must "
                             "give the reason (a str) or None")
        if reason is not None:
            return spec.name, reason
    raise ValueError(f"no registered backend accepts this situation ({situation}); name one of {backend_names()}")


def _dali(s: Situation) -> str | None:
    if s.device == "cuda" and dali_installed():
        return "CUDA and DALI present: nvJPEG decode and augmentation on the GPU"
    return None


def _prefetch(s: Situation) -> str | None:
    return "CUDA present, DALI not installed (pip install 'datapipe[dali]' for GPU decode)" if s.device == "cuda" else None


def _dataloader(s: Situation) -> str | None:
    return ("no CUDA, remote dataset: worker processes may call the object store themselves, threads of the rank "
            "process may not (datapipe.storage.isolate)") if s.remote else None


def _threads(s: Situation) -> str | None:
    return ("no CUDA, local dataset: decode threads fill preallocated batch buffers, no worker processes or "
            "pickling (docs/loaders.md: why, and when the dataloader is better)")


BUILT_IN: tuple[BackendSpec, ...] = (
    BackendSpec("threads", ".threads:ThreadLoader", _threads, 40,
                "decode threads filling preallocated batch buffers in the rank's process", inline_without_workers=True),
    BackendSpec("dataloader", ".dataloader:ProcessLoader", _dataloader, 30,
                "torch DataLoader worker processes (pinned memory)", transforms="any"),
    BackendSpec("prefetch", ".prefetch:PrefetchLoader", _prefetch, 20,
                "the dataloader backend plus a CUDA side stream (H2D copy and normalize on the GPU)", transforms="any",
                preview=False),  # its views are the dataloader's
    BackendSpec("dali", ".dali:DaliLoader", _dali, 10, "NVIDIA DALI: nvJPEG decode and augmentation on the GPU",
                transforms="none", requires="nvidia.dali", extra="dali"),
    BackendSpec("ray", ".ray:RayLoader", None, 100, "a Ray pool of CPU workers on other machines", requires="ray",
                extra="ray"),
)
for _spec in BUILT_IN:
    register_backend(_spec)

__all__ = ["BackendSpec", "Situation", "register_backend", "unregister_backend", "backend_names", "backend_choices",
           "backend_spec", "choose", "dali_installed", "local_backends", "module_installed", "preview_backends",
           "transform_backends"]
