"""`datapipe.Mix`: several datasets read as one weighted stream (docs/mixing.md).

    mix = datapipe.Mix({"imagenet": "in1k.lmdb", "web": "s3://bucket/web.wds", "ours": "photos/"},
                       weights={"imagenet": 0.6, "web": 0.3, "ours": 0.1}, epoch_size=1_281_167)
    loader = datapipe.make_loader(mix, batch_size=256)

An epoch holds exactly round(weight x epoch_size) samples of each source (largest remainder), spread
evenly through it; each source is an endless stream of its own permutations, so a source drawn less
than its size goes on next epoch where it stopped, and one drawn more cycles through fresh
permutations, every record once before any repeats (datapipe.mix.draws). A weight is read as the
number written: an int or a Fraction exactly, a float (Python's or NumPy's) as the shortest decimal that
reads back as it (0.7 is 7/10, not the binary float's 0.69999999999999995559...). `weights` may be a
function of the epoch (a curriculum); it must be pure: the draws of epoch e count on the weights of the
epochs before it. It is asked once an epoch per process (the answers are kept); a loader's state carries
the answers it used, its workers use the main process's, and ranks compare theirs (datapipe.mix.state).
Labels index `mix.classes`: the first source's classes in their order, then each later source's new
names (the same name is the same class; names equal once Unicode-normalised (NFC) too, with a warning;
names that differ only in case are refused), or the `classes=` given (a val mix labelled as its train
mix); a source without class names gives -1.
"""
from __future__ import annotations

import logging
import math
import numbers
import os
import pickle
import re
import unicodedata
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, Union

import numpy as np

from ..augment.recipe import Recipe, resolve_recipe
from ..checks import shown
from ..formats import open_dataset
from ..formats.base import Dataset
from ..storage import redact
from .draws import apportion
from .state import PURE

Weights = Union[Mapping[str, float], Callable[[int], Mapping[str, float]], None]
NAMED = re.compile(r"^([A-Za-z0-9_.-]+)=(.+)$")  # NAME=PATH
NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.")
log = logging.getLogger("datapipe")


@dataclass(frozen=True)
class Source:
    """A mix's source that needs more than a path: its own split, or its own per-record recipe (the
    view and pixel ops; the batch stage, mixup/cutmix and erasing, stays the loader's)."""

    path: Any  # anything make_loader opens (a path, a URL, a shard pattern), or an opened Dataset
    split: str = "train"
    recipe: Recipe | str | None = None


def _check_names(names: list[str]) -> None:
    if not names:
        raise ValueError("Mix needs at least one source: Mix({'name': 'path/to/dataset', ...})")
    for name in names:
        if not isinstance(name, str) or not name or not set(name) <= NAME_CHARS:
            raise ValueError(f"a mix's source name must be a non-empty string of letters, digits, '_', '-' or '.', "
                             f"got {name!r}")


class Mix:
    """Several sources as one weighted stream: `names`, `classes`, `sizes`, `len(mix)` (samples an
    epoch), `weights_at(e)` and `counts(e)`. Give it to make_loader (or `datapipe train A B --weights`)."""

    def __init__(self, sources: Mapping[str, Any], *, weights: Weights = None, epoch_size: int | None = None,
                 split: str = "train", classes: list[str] | None = None, cache_dir: str | Path | None = None,
                 cache_limit: int | None = None) -> None:
        if not isinstance(sources, Mapping):
            raise ValueError(f"Mix takes a dict of name -> dataset, e.g. Mix({{'a': 'a.lmdb', 'b': 'b.wds'}}), "
                             f"got {type(sources).__name__}")
        self.names = tuple(sources)
        _check_names(list(self.names))
        specs = [s if isinstance(s, Source) else Source(s, split) for s in sources.values()]
        self.datasets: tuple[Dataset, ...] = tuple(
            s.path if isinstance(s.path, Dataset) else
            open_dataset(s.path, s.split, cache_dir=cache_dir, cache_limit=cache_limit) for s in specs)
        self.recipes: tuple[Recipe | None, ...] = tuple(
            None if s.recipe is None else resolve_recipe(s.recipe) for s in specs)
        self.sizes = tuple(len(d) for d in self.datasets)
        empty = [n for n, size in zip(self.names, self.sizes) if size == 0]
        if empty:
            raise ValueError(f"source {empty[0]!r} of the mix ({self.datasets[self.names.index(empty[0])]}) has no "
                             "records: leave it out")
        self.classes, self.class_maps = merge_classes([d.classes for d in self.datasets], classes, self.names)
        self.epoch_size = sum(self.sizes) if epoch_size is None else _positive_int("epoch_size", epoch_size)
        self.starts = np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.int64)  # each source's first key
        if (self.epoch_size // min(self.sizes) + 2) * sum(self.sizes) >= 2**63:
            raise ValueError(f"epoch_size {self.epoch_size:,} over a source of {min(self.sizes):,} records would "
                             "make the draws' keys overflow 64 bits: give the small source fewer draws an epoch")
        self._weights = weights
        self.opening = (None if cache_dir is None else str(cache_dir), cache_limit)
        # per epoch: the weights function's answer (asked once); per (epoch or None for fixed weights, draws
        # an epoch): the counts, from the answer or a state's replayed
        self._answers: dict[int, tuple[Fraction, ...]] = {}
        self._counts: dict[tuple[int | None, int], tuple[int, ...]] = {}
        self._reached: dict[Any, tuple[int, tuple[int, ...]]] = {}  # per start: the furthest draws_before computed
        self.home = os.getpid()  # the process whose loader speaks for this rank (mix.state.agree)
        if not callable(weights):  # fixed weights: checked and counted now, the same every epoch
            self._fixed = (tuple(Fraction(n) for n in self.sizes) if weights is None
                           else _checked_weights(weights, self.names, None))
            self.counts(0)

    def __setstate__(self, state: dict[str, Any]) -> None:
        """A copy sent to another process by pickling (spawn) speaks for that process; a forked one
        keeps its parent's `home`, so a worker never talks to the ranks."""
        self.__dict__.update(state)
        self.home = os.getpid()

    def refuse_other_opening(self, cache_dir: Any, cache_limit: int | None, sha256: str | None) -> None:
        """make_loader's cache_dir, cache_limit and sha256 open one dataset; a mix opened its sources
        with its own (Mix(cache_dir=, cache_limit=)): other values there would be silently unused."""
        if sha256 is not None:
            raise ValueError("sha256= checks one dataset file before it is opened; a Mix opens its sources itself: "
                             "check them with datapipe.open_dataset(path, sha256=...) and give the opened datasets")
        given = (None if cache_dir is None else str(cache_dir), cache_limit)
        if given != (None, None) and given != self.opening:
            raise ValueError("a Mix opens its sources itself: give cache_dir= and cache_limit= to Mix(...), not to "
                             f"make_loader (the mix has {self.opening}, make_loader was given {given})")

    def check_picklable(self, where: str) -> None:
        """A one-line ValueError when a weights function cannot be sent to processes started by spawn."""
        if callable(self._weights):
            try:
                pickle.dumps(self._weights)
            except Exception as exc:
                raise ValueError(f"the Mix's weights function {self._weights!r} cannot be pickled for {where}, which "
                                 f"start by spawn ({type(exc).__name__}): give a module-level function") from None

    @property
    def curriculum(self) -> bool:
        """Whether the weights are a function of the epoch (asked per epoch, compared across ranks)."""
        return callable(self._weights)

    def __len__(self) -> int:
        """Samples an epoch (all ranks together)."""
        return self.epoch_size

    def weights_at(self, epoch: int) -> tuple[Fraction, ...]:
        """The weights of `epoch`, in the order of `names`, as exact numbers (checked: non-negative,
        finite, not all 0). A weights function is asked once per epoch in this process."""
        if not callable(self._weights):
            return self._fixed
        found = self._answers.get(epoch)
        if found is None:
            found = self._answers[epoch] = _checked_weights(self._weights(epoch), self.names, epoch)
        return found

    def counts(self, epoch: int, draws: int | None = None) -> tuple[int, ...]:
        """Samples each source gives in `epoch` (they sum to len(self)); given `draws`, the draws each
        gives when an epoch draws that many (repeated augmentation: each draw served aug_repeats times)."""
        key = (epoch if callable(self._weights) else None, self.epoch_size if draws is None else draws)
        found = self._counts.get(key)
        if found is None:
            found = self._counts[key] = apportion(self.weights_at(epoch), key[1])
        return found

    def replay(self, epoch: int, counts: tuple[int, ...]) -> None:
        """A resumed state's counts of `epoch` (the answer its run used: they sum to its draws an epoch),
        kept so that the weights function is not asked for it; one that differs from this process's
        answer is refused (the function is not pure). Fixed weights are not replayed: a resume compares
        their counts."""
        if not callable(self._weights):
            return
        known = self._counts.setdefault((epoch, sum(counts)), tuple(counts))
        if known != tuple(counts):
            raise ValueError(f"the Mix's weights function is not pure: it answered epoch {epoch} with the counts "
                             f"{shown(list(known))} in this process, and the state resumed holds "
                             f"{shown(list(counts))}; {PURE}")

    def draws_before(self, epoch: int, since: tuple[int, tuple[int, ...]] | None = None,
                     per_epoch: int | None = None) -> tuple[int, ...]:
        """Per source, the draws of the epochs before `epoch`: from epoch 0, or from `since`
        (epoch, draws then) that a resumed run carries (its epochs before may have had other weights),
        each epoch drawing `per_epoch` (default epoch_size). Continues from the furthest epoch computed
        from the same start (O(1) an epoch over a run)."""
        start, draws = since if since is not None and since[0] <= epoch else (0, (0,) * len(self.names))
        origin = (start, tuple(draws), per_epoch)
        reached = self._reached.get(origin)
        if reached is not None and start <= reached[0] <= epoch:
            start, draws = reached
        for e in range(start, epoch):
            draws = tuple(d + c for d, c in zip(draws, self.counts(e, per_epoch)))
        if len(self._reached) > 16:
            self._reached.clear()
        self._reached[origin] = (epoch, tuple(draws))
        return tuple(draws)

    def table(self, epoch: int = 0) -> list[dict[str, Any]]:
        """Per source, for `epoch`: its size, weight share, draws, and epochs until it repeats a record
        (its size over its draws an epoch; None when it is drawn 0 times). Paths without credentials."""
        weights, counts = self.weights_at(epoch), self.counts(epoch)
        total = sum(weights)  # exact: weights of 1e308 sum without overflow
        return [{"source": name, "path": redact(str(dataset.path)), "records": size, "weight": float(w / total),
                 "draws": c,
                 "epochs_per_pass": size / c if c else None}
                for name, dataset, size, w, c in zip(self.names, self.datasets, self.sizes, weights, counts)]

    @property
    def fingerprint(self) -> dict[str, Any]:
        """What a resume position depends on: the names, each source's records, the epoch size."""
        return {"names": list(self.names), "sources": [d.fingerprint or f"{d.path}|{len(d)}" for d in self.datasets],
                "epoch_size": self.epoch_size}

    def __repr__(self) -> str:
        parts = ", ".join(f"{n}={d.path}" for n, d in zip(self.names, self.datasets))
        return f"Mix({parts}, epoch_size={self.epoch_size})"


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1 (samples an epoch), got {value!r}")
    return value


def exact_weight(w: numbers.Real) -> Fraction:
    """A weight as the number written: an int or a Fraction exactly; a float (Python's or NumPy's) as
    the shortest decimal that reads back as it, so 0.7 is 7/10 as "0.7" on the command line is."""
    if isinstance(w, numbers.Rational):
        return Fraction(int(w.numerator), int(w.denominator))
    return Fraction(str(w) if isinstance(w, np.floating) else repr(float(w)))


def _checked_weights(given: Any, names: tuple[str, ...], epoch: int | None) -> tuple[Fraction, ...]:
    where = "" if epoch is None else f" (the weights function's answer for epoch {epoch})"
    if not isinstance(given, Mapping):
        raise ValueError(f"weights must map each source name to a number, e.g. {{{names[0]!r}: 0.7, ...}}{where}, "
                         f"got {type(given).__name__}")
    unknown = [k for k in given if k not in names]
    missing = [n for n in names if n not in given]
    if unknown or missing:
        problem = f"no source named {unknown[0]!r}" if unknown else f"no weight for source {missing[0]!r}"
        raise ValueError(f"weights{where}: {problem}; give one weight per source of {list(names)} (0 skips a source)")
    out = []
    for name in names:
        w = given[name]
        if isinstance(w, bool) or not isinstance(w, numbers.Real) or not math.isfinite(w) or w < 0:
            raise ValueError(f"weights{where}: source {name!r} has weight {shown(w)}; a weight is a finite number >= 0")
        out.append(exact_weight(w))
    if sum(out) <= 0:
        raise ValueError(f"weights{where} are all 0: at least one source must have a weight above 0")
    return tuple(out)


def merge_classes(lists: list[list[str]], given: list[str] | None = None,
                  sources: tuple[str, ...] = ()) -> tuple[list[str], tuple[tuple[int, ...], ...]]:
    """The mix's class names (the first source's in order, then each later source's new ones; or
    `given`, which must hold them all: a val mix labelled as its train mix) and per source, its
    label -> the mix's label. A name is a class; a name equal to an earlier source's once both are
    NFC-normalised is that class (one file system wrote it decomposed: a warning says so); a name
    that differs from an earlier one only in case is refused (one class or two? only its owner knows)."""
    classes: list[str] = list(given or [])
    origin = ["the given classes"] * len(classes)
    where: dict[str, int] = {name: k for k, name in enumerate(classes)}
    folded: tuple[dict[str, int], dict[str, int]] = ({}, {})  # NFC form, NFC case-folded form -> class
    _fold(folded, classes, 0)
    maps = []
    for s, names in enumerate(lists):
        source = repr(sources[s]) if s < len(sources) else str(s)
        known, row, merged = len(classes), [], []
        for name in names:
            k = where.get(name)
            if k is None:
                k = _same_class(name, source, classes, origin, folded)
                merged += [] if k is None else [(name, k)]
            if k is None and given is not None:
                raise ValueError(f"a source's class {shown(name)} is not among the mix's given classes "
                                 f"({len(given)}: {shown(given[:5])}...); a val split must use the train split's class "
                                 "names")
            if k is None:
                k = where[name] = len(classes)
                classes.append(name)
                origin.append(f"source {source}")
            row.append(k)
        _fold(folded, classes, known)  # after the source: its own names never merge with each other
        if merged:
            log.warning("mix: %d class name(s) of source %s are an earlier source's written in another Unicode form "
                        "(NFC/NFD), each one class with it (the first: %r is %r of %s)", len(merged), source,
                        merged[0][0], classes[merged[0][1]], origin[merged[0][1]])
        maps.append(tuple(row))
    return classes, tuple(maps)


def _fold(folded: tuple[dict[str, int], dict[str, int]], classes: list[str], start: int) -> None:
    """Classes from `start` on into the (NFC form, NFC case-folded form) -> class tables."""
    for k in range(start, len(classes)):
        form = unicodedata.normalize("NFC", classes[k])
        folded[0].setdefault(form, k)
        folded[1].setdefault(form.casefold(), k)


def _same_class(name: str, source: str, classes: list[str], origin: list[str],
                folded: tuple[dict[str, int], dict[str, int]]) -> int | None:
    """The earlier class `name` is once NFC-normalised, None for a new name; a name that differs from
    an earlier one only in case is refused in one line naming both."""
    form = unicodedata.normalize("NFC", name)
    k = folded[0].get(form)
    if k is not None:
        return k
    k = folded[1].get(form.casefold())
    if k is not None:
        raise ValueError(f"class {shown(name)} of source {source} and class {shown(classes[k])} of {origin[k]} differ "
                         "only in case: rename one so that they are one class (the same name) or plainly two, and "
                         "convert that dataset again")
    return None


def source_names(data: list[str]) -> dict[str, str]:
    """name -> path: `NAME=PATH` as given (a name given twice is refused), else the path's last part
    (`in1k.lmdb`, `web.wds`, `photos`), made unique with -2, -3, ... where two are alike."""
    out: dict[str, str] = {}
    for item in data:
        named = NAMED.match(item)
        if named and "://" not in item.split("=", 1)[0]:
            name, path = named[1], named[2]
            if name in out:
                raise ValueError(f"the name {shown(name)} is given to two datasets ({shown(out[name])} and "
                                 f"{shown(path)}): name each once (NAME=PATH), or leave the names out to have them "
                                 "made from the paths")
        else:
            path = item
            name = re.sub(r"[^A-Za-z0-9_.-]", "_", item.rstrip("/").rsplit("/", 1)[-1]) or "data"
        base, k = name, 2
        while name in out:
            name, k = f"{base}-{k}", k + 1
        out[name] = path
    return out


def mix_source(data: list[str], weights: Any, epoch_size: int | None, **mix_options: Any) -> Any:
    """One path as it is, or the Mix of several (or of one given weights or an epoch size): `weights` a
    sequence, one per path, in order (the command line's --weights)."""
    if len(data) == 1 and weights is None and epoch_size is None:
        return data[0]
    sources = source_names(list(data))
    given = None if weights is None else dict(zip(sources, weights))
    return Mix(sources, weights=given, epoch_size=epoch_size, **mix_options)
