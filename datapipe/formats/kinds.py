"""The dataset kinds open_dataset tells apart, in one table: what claims a path, and how it is opened.

A kind is a name, a `claims(path)` test and an `open(path, split, *, cache_dir, cache_limit)` that
returns a Dataset. open_dataset asks the kinds in `rank` order, lowest first, and opens the first
that claims the path: a URL, Parquet files, other tools' WebDataset shards, a packed dataset (its
manifest: one FormatSpec a format, datapipe.formats.FORMATS), a plain image folder (the last, it
claims any folder without a manifest). Adding a kind is one module plus one `register_kind(...)`.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from ..checks import shown
from ..errors import ExpectedError

if TYPE_CHECKING:
    from .base import Dataset

Opener = Callable[..., "Dataset"]  # (path, split, *, cache_dir: Path | None, cache_limit: int | None) -> Dataset


@dataclass(frozen=True)
class DatasetKind:
    name: str
    claims: Callable[["str | Path"], bool]
    open: Opener
    rank: int = 50  # the built-in kinds: url 10, parquet 20, shards 30, packed 40, folder 90

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"a dataset kind's name must be a non-empty str, got {self.name!r}")
        for field in ("claims", "open"):
            if not callable(getattr(self, field)):
                raise ValueError(f"dataset kind {self.name!r}: {field} must be a function, got "
                                 f"{shown(getattr(self, field))}")
        if type(self.rank) is not int:
            raise ValueError(f"dataset kind {self.name!r}: rank must be an int, got {shown(self.rank)}")


_KINDS: dict[str, DatasetKind] = {}


def register_kind(kind: DatasetKind, *, replace: bool = False) -> DatasetKind:
    """Add `kind` to what open_dataset (and so make_loader and every CLI command) can open; a name taken
    is refused unless `replace`."""
    if kind.name in _KINDS and not replace:
        raise ValueError(f"a dataset kind named {kind.name!r} is registered already; pass replace=True to replace it")
    _KINDS[kind.name] = kind
    return kind


def unregister_kind(name: str) -> None:
    _KINDS.pop(name, None)


def dataset_kinds() -> tuple[DatasetKind, ...]:
    """The kinds in the order open_dataset asks them."""
    return tuple(sorted(_KINDS.values(), key=lambda k: k.rank))


def kind_of(path: "str | Path") -> DatasetKind | None:
    """The first kind, by rank, that claims `path`; None when none does. A claims test that raises what
    the library speaks in (ValueError, OSError, ExpectedError) is let through; anything else is the
    kind's own bug: a ValueError naming it."""
    for kind in dataset_kinds():
        try:
            if kind.claims(path):
                return kind
        except (ValueError, OSError, ExpectedError):
            raise
        except Exception as exc:  # noqa: BLE001 - a registered kind's own bug, named
            raise ValueError(f"dataset kind {kind.name!r}: its claims test raised {shown(exc)} for "
                             f"{shown(str(path))}; fix or unregister the kind") from exc
    return None


def opened(kind: DatasetKind, dataset: object) -> "Dataset":
    """What `kind.open` gave, when it is a Dataset; else a ValueError naming the kind."""
    from .base import Dataset

    if not isinstance(dataset, Dataset):
        raise ValueError(f"dataset kind {kind.name!r}: its open gave {shown(dataset)}, not a "
                         "datapipe.formats.base.Dataset")
    return dataset
