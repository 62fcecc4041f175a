"""The on_error policy every backend applies to one record: raise naming it, or serve a substitute
and report the bad one (BadSample); the loader bounds how many an epoch may have (TooManyBadSamples)."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import NamedTuple, TypeVar

import numpy as np

from ..errors import ExpectedError
from ..formats.base import Dataset
from ..storage import StoreError


class BadSample(NamedTuple):
    """A record that could not be read or decoded, and the record served in its place."""

    index: int
    path: str
    reason: str
    substitute: int = -1


class TooManyBadSamples(ExpectedError, RuntimeError):
    """More records of an epoch failed than max_bad_fraction allows: the data, not one file, is broken."""


SUBSTITUTE_TRIES = 8


def record_path(dataset: Dataset, index: int) -> str:
    """A record's original path for an error message, or its number when even that cannot be read."""
    try:
        return dataset.origin(index) or f"record {index}"
    except Exception:  # the store itself is damaged: the number is all there is
        return f"record {index}"


def substitutes(index: int, size: int, *, seed: int, epoch: int, start: int = 0) -> Iterator[int]:
    """Records to serve in place of a bad one, in a fixed order, from records start..start + size - 1
    (a mix's: the bad record's own source, so the mix's counts hold): a batch keeps its size (so ranks
    keep equal batch counts and resume positions stay exact) and the choice is reproducible."""
    rng = np.random.default_rng([seed, epoch, index, 7])
    for _ in range(SUBSTITUTE_TRIES):
        candidate = start + int(rng.integers(size))
        if candidate != index:
            yield candidate


T = TypeVar("T")


def serve_or_substitute(prepare: Callable[[int], T], dataset: Dataset, index: int, *, seed: int, epoch: int,
                        skip: bool) -> tuple[T, int, BadSample | None]:
    """The on_error policy for one record, shared by every backend: (prepare(index), index, None);
    or, when it fails, raise naming the record (skip=False) or serve a substitute and say so."""
    try:
        return prepare(index), index, None
    except StoreError:  # the store failed, not this record: substituting would hide it
        raise
    except Exception as exc:  # stores and decoders raise many types for bad records; which record is what matters
        path = record_path(dataset, index)
        if not skip:
            raise RuntimeError(f"cannot read or decode record {index} ({path}): {type(exc).__name__}: {exc}") from exc
        reason = f"{type(exc).__name__}: {exc}"
    start, size = dataset.neighbours(index)
    for other in substitutes(index, size, seed=seed, epoch=epoch, start=start):
        try:
            return prepare(other), other, BadSample(index, path, reason, other)
        except StoreError:  # the store failed (DatasetReplaced among them): not a record to serve around
            raise
        except Exception:
            continue
    raise RuntimeError(f"record {index} ({path}) is bad ({reason}) and so were the records tried in its place: "
                       "the dataset looks broken; run `datapipe verify` on it")
