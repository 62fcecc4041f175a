"""A mix's sources as one Dataset the backends read: record i of the concatenation (source s's records
at starts[s]..starts[s + 1]), its label moved into the mix's classes. The backends see record
indices of this concatenation; the loader hands out indices inside each source and the source's
number (`sources_of`)."""
from __future__ import annotations

import copy
from collections.abc import Callable

import numpy as np

from ..augment.plan import fill_color
from ..augment.recipe import Recipe
from ..checks import shown
from ..formats.base import Dataset
from ..records import Fields, Record, Sample
from ..storage import redact
from .sources import Mix


class MixLocation:
    """Where a mix's records are: remote if any source is (the backends then read it as remote data)."""

    def __init__(self, datasets: tuple[Dataset, ...]) -> None:
        self.parts = tuple(d.location for d in datasets)

    @property
    def remote(self) -> bool:
        return any(p.remote for p in self.parts)

    def describe(self, name: str = "") -> str:
        """Each source's location (of `name` in each, where one is given), joined: a mix has no one folder."""
        return " + ".join(p.describe(name) for p in self.parts)


class MixDataset(Dataset):
    """The concatenation of a Mix's sources, labels (and multi-label ids) in the mix's classes."""

    format = "mix"

    def __init__(self, mix: Mix) -> None:
        self.mix = mix
        self.datasets = mix.datasets
        self.starts = mix.starts
        path = "mix(" + ", ".join(f"{n}={redact(d.path)}" for n, d in zip(mix.names, self.datasets)) + ")"
        splits = {d.split for d in self.datasets}
        self.path, self.classes, self._size = path, list(mix.classes), int(self.starts[-1])
        self.split = splits.pop() if len(splits) == 1 else "mixed"
        self.location = MixLocation(self.datasets)  # type: ignore[assignment]
        self.validated = all(d.validated for d in self.datasets)
        self.fields = tuple(f for f in self.datasets[0].fields if all(f in d.fields for d in self.datasets))
        self._maps = [np.asarray(m + (-1,), np.int64) for m in mix.class_maps]  # label -1 (none) stays -1
        self.fingerprint = None  # a mix's resume checks are its order's (mix.order.MixOrder.restore)

    def locate(self, index: int) -> tuple[int, int]:
        """(source number, record index inside it) of a concatenation index."""
        source = int(np.searchsorted(self.starts, index, side="right")) - 1
        return source, index - int(self.starts[source])

    def sources_of(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(source numbers, indices inside each source) of concatenation indices, vectorised."""
        indices = np.asarray(indices, dtype=np.int64)
        source = np.searchsorted(self.starts, indices, side="right") - 1
        return source, indices - self.starts[source]

    def recipe_of(self, index: int, default: Recipe) -> Recipe:
        """The per-record recipe of the record's source (Source(recipe=...)), else `default`."""
        own = self.mix.recipes[self.locate(index)[0]]
        return default if own is None else own

    def with_datasets(self, datasets: tuple[Dataset, ...]) -> "MixDataset":
        """This concatenation over other handles of the same sources (a decode thread's own: threads.thread_view)."""
        view = copy.copy(self)
        view.datasets = tuple(datasets)
        return view


    def _label(self, source: int, label: int) -> int:
        """A source's label in the mix's classes; -1 for none, or for a source without class names."""
        table = self._maps[source]
        return int(table[label]) if 0 <= label < len(table) - 1 else -1

    def __getitem__(self, index: int) -> Sample:
        source, local = self.locate(self._check(index))
        sample = self.datasets[source][local]
        return Sample(sample.key, sample.data, self._label(source, sample.label))

    def _read(self, index: int) -> Record:
        source, local = self.locate(index)
        record = self.datasets[source].record(local)
        fields = record.fields
        if fields.labels is not None:
            fields = Fields(fields.text, fields.meta, tuple(sorted(self._label(source, i) for i in fields.labels)))
        return record._replace(label=self._label(source, record.label), fields=fields)

    def neighbours(self, index: int) -> tuple[int, int]:
        """A bad record is served around with a record of its own source (the mix's counts hold)."""
        source, _ = self.locate(index)
        return int(self.starts[source]), int(self.starts[source + 1] - self.starts[source])

    def origin(self, index: int) -> str:
        source, local = self.locate(self._check(index))
        return f"{self.mix.names[source]}:{self.datasets[source].origin(local)}"

    def read_ahead(self, shards: list[int]) -> None:
        """Mixes are read with the global order: no shard hints."""

    def __repr__(self) -> str:
        # the names and paths as a repr shows them (a file name's escapes as text, as a Dataset's repr), cut
        return f"MixDataset({shown(self.path, limit=160)}, records={len(self)}, epoch_size={self.mix.epoch_size})"


def refuse_other_fills(dataset: Dataset, default: Recipe) -> None:
    """DALI's graph fills uncovered pixels with one colour: a mix's sources' recipes must agree on it."""
    fills = {fill_color(r) for r in recipes_of(dataset, default)}
    if len(fills) > 1:
        raise ValueError(f"the DALI backend fills uncovered pixels with one colour, and this mix's recipes use "
                         f"{sorted(fills)} (their mean): give the sources recipes with the same mean, or use "
                         "backend='threads' or 'dataloader'")


def recipes_of(dataset: Dataset, default: Recipe) -> tuple[Recipe, ...]:
    """Every recipe a loader over `dataset` plans with: the loader's, and a mix's sources' own."""
    own = dataset.mix.recipes if isinstance(dataset, MixDataset) else ()
    return (default, *(r for r in own if r is not None))


def recipe_lookup(dataset: Dataset) -> "Callable[[int, Recipe], Recipe] | None":
    """(index, the loader's recipe) -> the record's recipe, for a mix with a per-source recipe; else None."""
    if isinstance(dataset, MixDataset) and any(r is not None for r in dataset.mix.recipes):
        return dataset.recipe_of
    return None
