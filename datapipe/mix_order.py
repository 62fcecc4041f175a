"""A mix's epoch order: EpochOrder's ranks, padding and resume positions over an epoch of len(mix)
positions, each position's record computed from (seed, epoch, position) by datapipe.mix_draws.

A position's key is its record's index in the concatenation of the sources (mix_dataset), plus the
total record count times the draw's cycle within this epoch when a source repeats a record in one
epoch (so the copies' augmentations differ; sharding.record_of takes the key back to the record).

The draws of the epochs before count (a source continues where it stopped): they are computed from
the mix's weights, or carried by a resumed state (`since`), so a run resumed with other weights at
an epoch boundary continues each source's stream exactly.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .mix import Mix
from .mix_draws import ShardStream, SourceStream, locate
from .order import derive_key
from .sharding import EpochOrder, RankBatch

MIX_ORDER = "mix-1"  # the mix's draws' version, saved with every position


@dataclass
class MixState:
    """The mix, what a resumed state carried ((epoch, per-source draws before it), or None), and per
    source the shard sizes of one read shard by shard (mix_draws.ShardStream), None for one read with
    a permutation of its records."""

    mix: Mix
    since: tuple[int, tuple[int, ...]] | None = None
    shard_sizes: tuple[tuple[int, ...] | None, ...] = ()  # () for none
    mix_shards: tuple[int, ...] = ()  # per source read shard by shard: its blocks' shards

    def __post_init__(self) -> None:
        count = len(self.mix.names)
        self.shard_sizes, self.mix_shards = self.shard_sizes or (None,) * count, self.mix_shards or (1,) * count

    @property
    def streams(self) -> list[str]:
        """How each source is read: "records" (a permutation of its records) or "shards/B" (ShardStream)."""
        return ["records" if sizes is None else f"shards/{block}" for sizes, block in
                zip(self.shard_sizes, self.mix_shards)]

    def draws_before(self, epoch: int) -> tuple[int, ...]:
        return self.mix.draws_before(epoch, self.since)


class MixKeys:
    """Position -> key for one epoch of a mix (the EpochKeys of a mix)."""

    def __init__(self, state: MixState, *, seed: int, epoch: int, shuffle: bool) -> None:
        mix = state.mix
        self.counts, self.before = mix.counts(epoch), state.draws_before(epoch)
        self.key = derive_key(seed, epoch) if shuffle else None
        self.starts, self.total = mix.starts, int(mix.starts[-1])
        self.streams = [SourceStream(n, seed=seed, name=name, shuffle=shuffle) if shards is None else
                        ShardStream(shards, seed=seed, name=name, shuffle=shuffle, mix_shards=block)
                        for n, name, shards, block in zip(mix.sizes, mix.names, state.shard_sizes, state.mix_shards)]

    def draws(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(source, the source's draw number since epoch 0) of each position."""
        source, j = locate(self.counts, positions, self.key)
        return source, np.asarray(self.before, np.int64)[source] + j

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        positions = np.asarray(positions, dtype=np.int64)
        source, draw = self.draws(positions.reshape(-1))
        keys = np.empty(draw.shape, np.int64)
        for s in np.unique(source):
            where = source == s
            stream = self.streams[s]
            record, cycle = stream.records(draw[where])
            first = self.before[s] // stream.size  # the cycle this epoch starts in
            keys[where] = self.starts[s] + record + (cycle - first) * self.total
        return keys.reshape(positions.shape)


@dataclass(frozen=True)
class MixOrder(EpochOrder):
    """The batches of keys one rank reads in one epoch of a mix, from any global position on."""

    state: MixState = field(default=None, compare=False)  # type: ignore[assignment]

    keys_are_records = False  # a key may carry a cycle (Loader._repeat_keys reads the keys)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.repeats != 1:
            raise ValueError(f"aug_repeats={self.repeats} (repeated augmentation) is not available over a Mix: "
                             "give aug_repeats=1 (a source's weight already sets how often its records come)")

    def _batch_at(self, epoch: int, offset: int) -> RankBatch:
        keys = MixKeys(self.state, seed=self.seed, epoch=epoch, shuffle=self.shuffle)
        count = self.num_batches(offset) * self.batch_size if self.drop_last else self.samples_per_rank(offset)
        return RankBatch(self, keys, min(offset, self.size), count)  # type: ignore[arg-type]

    def encode(self, offset: int) -> dict[str, Any]:
        """The position as DALI's workers receive it, with what a resume carried (their copy of the
        order was made when the pipeline was built)."""
        since = self.state.since
        return {"samples": int(offset), "since": None if since is None else [since[0], list(since[1])]}

    def decode(self, value: Any) -> int:
        if isinstance(value, dict):
            since = value.get("since")
            self.state.since = None if since is None else (int(since[0]), tuple(int(d) for d in since[1]))
            value = value["samples"]
        return min(int(value), self.size)

    def _mine(self, epoch: int) -> dict[str, Any]:
        """What a mid-epoch position depends on beside the samples done: the sources, the epoch's counts
        (weights that round to the same counts serve the same samples), the draws' version, how each
        source is read."""
        mix = self.state.mix
        return {**mix.fingerprint, "counts": list(mix.counts(epoch)), "order": MIX_ORDER,
                "streams": self.state.streams}

    def save(self, offset: int, epoch: int = 0) -> dict[str, Any]:
        """The position with the mix's block: what a mid-epoch position depends on (at an epoch's start
        only the names, classes and epoch size: the weights of an epoch not begun are not asked for, a
        curriculum may end with the run), and each source's draws before this epoch."""
        mix = self.state.mix
        mine = self._mine(epoch) if offset else {**mix.fingerprint, "streams": self.state.streams}
        return {**super().save(offset, epoch), "mix": {
            **mine, "classes": list(mix.classes), "draws_before": dict(zip(mix.names, self.state.draws_before(epoch)))}}

    def restore(self, state: dict[str, Any]) -> int:
        refuse_single_state(state)
        saved = state["mix"]
        epoch = int(state["epoch"])
        mix = self.state.mix
        refuse_other_classes(saved.get("classes"), mix.classes)
        done = self.decode(state.get("samples_done", 0))
        if done > 0:
            refuse_other_mix(saved, self._mine(epoch))
        carried = saved.get("draws_before", {})
        self.state.since = (epoch, tuple(int(carried.get(name, 0)) for name in mix.names))
        state = {k: v for k, v in state.items() if k != "mix"}
        return super().restore(state)


def refuse_single_state(state: dict[str, Any]) -> None:
    """A state saved over one dataset counts positions in that dataset's epoch, not a mix's."""
    if "mix" not in state:
        raise ValueError("cannot resume: the state was saved by a loader over one dataset, this loader reads a "
                         "Mix; resume with the loader it was saved with")


def refuse_other_classes(saved: list[str] | None, mine: list[str]) -> None:
    """A model trained on the saved mix's label indices: a class that now has another index (the
    sources in another order, say) would silently change what a label means. New classes at the end
    are fine."""
    if saved is None:
        return
    moved = [name for k, name in enumerate(saved) if k >= len(mine) or mine[k] != name]
    if moved:
        raise ValueError(f"cannot resume: the mix's classes changed order (class {moved[0]!r} was label "
                         f"{saved.index(moved[0])}, it is {mine.index(moved[0]) if moved[0] in mine else 'gone'} now): "
                         "give the sources in the order they were saved with; new classes may only come after")


def refuse_other_mix(saved: dict[str, Any], mine: dict[str, Any]) -> None:
    """A mid-epoch position under another mix (sources, their records, weights, epoch size, draws'
    version) would serve other samples: one line naming the first difference."""
    labels = {"names": "sources", "sources": "source records (a source re-converted or replaced)",
              "epoch_size": "epoch_size", "counts": "per-source counts (weights)", "order": "mix draws' version",
              "streams": "ways of reading the sources (sampling, mix_shards)"}
    for key, label in labels.items():
        if key in saved and saved[key] != mine[key]:
            raise ValueError(f"cannot resume mid-epoch: the state was saved with other {label} ({saved[key]!r}, this "
                             f"mix has {mine[key]!r}); resume at an epoch boundary to change them, or with the mix it "
                             "was saved with")
