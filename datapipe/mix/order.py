"""A mix's epoch order: EpochOrder's ranks, padding and resume positions over an epoch of len(mix)
positions, each position's record computed from (seed, epoch, position) by datapipe.mix.draws.

A position's key is its record's index in the concatenation of the sources (mix.dataset), plus the
total record count times the draw's cycle within this epoch when a source repeats a record in one
epoch (so the copies' augmentations differ; sharding.record_of takes the key back to the record).
Under repeated augmentation (aug_repeats r, timm's RepeatAugSampler) an epoch draws ceil(len(mix) / r)
times, by the weights, and serves each draw r times in a row (the ranks' interleaving sends the copies
to different ranks), copy k's key offset by k times the total record count.

The draws of the epochs before count (a source continues where it stopped): they are computed from
the mix's weights, or carried by a resumed state (`since`), so a run resumed with other weights at
an epoch boundary continues each source's stream exactly. An epoch's answers (its counts, the draws
before it) are the main process's: asked there once, compared across ranks (mix.state.agree), and
sent with the position to DALI's workers, which never ask the weights function themselves.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..checks import shown
from ..order.permutation import derive_key
from ..order.sharding import EpochOrder, RankBatch, Shard
from ..storage import redact
from .draws import ShardStream, SourceStream, locate
from .sources import Mix
from .state import MAX_DRAWS, WEIGHTS_READ, agree, check_block

log = logging.getLogger(__name__)
MIX_ORDER = "mix-1"  # the mix's draws' version, saved with every position
OLD_WEIGHTS = (" (this datapipe reads a float weight as the decimal it is written as, 0.7 as 7/10, where the one "
               "that saved it read the binary float: the counts may differ by one)")


@dataclass
class MixState:
    """The mix, what a resumed state carried ((epoch, per-source draws before it), or None), and per
    source the shard sizes of one read shard by shard (mix.draws.ShardStream), None for one read with
    a permutation of its records."""

    mix: Mix
    since: tuple[int, tuple[int, ...]] | None = None
    shard_sizes: tuple[tuple[int, ...] | None, ...] = ()  # () for none
    interleave_shards: tuple[int, ...] = ()  # per source read shard by shard: its blocks' shards
    # per epoch, the (counts, draws before) the main process sent with the position (a DALI worker's copy)
    carried: dict[int, tuple[tuple[int, ...], tuple[int, ...]]] = field(default_factory=dict)
    agreed: set[tuple] = field(default_factory=set)  # answers the ranks compared
    repeats: int = 1  # repeated augmentation: each draw served this many times (the order's)

    def __post_init__(self) -> None:
        count = len(self.mix.names)
        self.shard_sizes = self.shard_sizes or (None,) * count
        self.interleave_shards = self.interleave_shards or (1,) * count

    @property
    def streams(self) -> list[str]:
        """How each source is read: "records" (a permutation of its records) or "shards/B" (ShardStream)."""
        return ["records" if sizes is None else f"shards/{block}" for sizes, block in
                zip(self.shard_sizes, self.interleave_shards)]

    @property
    def per_epoch(self) -> int:
        """Draws an epoch: its samples, or under repeated augmentation, their share of distinct draws."""
        return math.ceil(self.mix.epoch_size / self.repeats)

    def draws_before(self, epoch: int) -> tuple[int, ...]:
        return self.mix.draws_before(epoch, self.since, self.per_epoch)

    def counts(self, epoch: int) -> tuple[int, ...]:
        """Each source's draws in `epoch` (its samples, times the repeats)."""
        return self.mix.counts(epoch, self.per_epoch)

    def answers(self, epoch: int, shard: Shard | None = None) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(counts, draws before) of `epoch`: those the main process sent (a DALI worker), else this
        process's, compared across ranks once where a weights function gave them and `shard` is the
        loader's place among the ranks."""
        found = self.carried.get(epoch)
        if found is None:
            found = (self.counts(epoch), self.draws_before(epoch))
            if shard is not None and self.mix.curriculum and (epoch, *found) not in self.agreed:
                agree(self.mix, epoch, *found, shard.rank, shard.world_size)
                self.agreed.add((epoch, *found))
        return found


class MixKeys:
    """Position -> key for one epoch of a mix (the EpochKeys of a mix)."""

    def __init__(self, state: MixState, *, seed: int, epoch: int, shuffle: bool, shard: Shard | None = None) -> None:
        mix = state.mix
        self.counts, self.before = state.answers(epoch, shard)
        self.repeats = state.repeats
        self.key = derive_key(seed, epoch) if shuffle else None
        self.starts, self.total = mix.starts, int(mix.starts[-1])
        self.streams = [SourceStream(n, seed=seed, name=name, shuffle=shuffle) if shards is None else
                        ShardStream(shards, seed=seed, name=name, shuffle=shuffle, interleave_shards=block)
                        for n, name, shards, block in zip(mix.sizes, mix.names, state.shard_sizes,
                                                          state.interleave_shards)]

    def draws(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(source, the source's draw number since epoch 0) of each position."""
        source, j = locate(self.counts, positions, self.key)
        return source, np.asarray(self.before, np.int64)[source] + j

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        positions = np.asarray(positions, dtype=np.int64)
        number, copy = np.divmod(positions.reshape(-1), self.repeats)  # the epoch's draw, which copy of it
        source, draw = self.draws(number)
        keys = np.empty(draw.shape, np.int64)
        for s in np.unique(source):
            where = source == s
            stream = self.streams[s]
            record, cycle = stream.records(draw[where])
            first = self.before[s] // stream.size  # the cycle this epoch starts in
            keys[where] = self.starts[s] + record + ((cycle - first) * self.repeats + copy[where]) * self.total
        return keys.reshape(positions.shape)


@dataclass(frozen=True)
class MixOrder(EpochOrder):
    """The batches of keys one rank reads in one epoch of a mix, from any global position on."""

    state: MixState = field(default=None, compare=False)  # type: ignore[assignment]

    keys_are_records = False  # a key may carry a cycle or a copy (Loader._repeat_keys reads the keys)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.state.repeats = self.repeats
        mix = self.state.mix
        if (self.state.per_epoch // min(mix.sizes) + 2) * self.repeats * int(mix.starts[-1]) >= 2**63:
            raise ValueError(f"aug_repeats={self.repeats} over epoch_size {mix.epoch_size:,} and a source of "
                             f"{min(mix.sizes):,} records would make the draws' keys overflow 64 bits: give the small "
                             "source fewer draws an epoch")

    def _batch_at(self, epoch: int, offset: int) -> RankBatch:
        keys = MixKeys(self.state, seed=self.seed, epoch=epoch, shuffle=self.shuffle, shard=self.shard)
        count = self.num_batches(offset) * self.batch_size if self.drop_last else self.samples_per_rank(offset)
        return RankBatch(self, keys, min(offset, self.size), count)  # type: ignore[arg-type]

    def encode(self, offset: int, epoch: int | None = None) -> dict[str, Any]:
        """The position as DALI's workers receive it, with what a resume carried (their copy of the
        order was made when the pipeline was built) and, given the epoch, its answers: the workers
        serve the main process's counts and draws, never asking the weights function themselves."""
        since = self.state.since
        out = {"samples": int(offset), "since": None if since is None else [since[0], list(since[1])]}
        if epoch is not None:
            counts, before = self.state.answers(epoch, self.shard)
            out.update(epoch=int(epoch), counts=list(counts), before=list(before))
        return out

    def decode(self, value: Any) -> int:
        """The position `encode` gave, without its draws (pure: `adopt` takes them)."""
        if isinstance(value, dict):
            value = value["samples"]
        return min(int(value), self.size)

    def adopt(self, value: Any) -> int:
        """The position `encode` gave, its draws and the epoch's counts taken into this order's state (a
        DALI source worker's order learns them so: the main process's mix is not asked again)."""
        if isinstance(value, dict):
            since = value.get("since")
            self.state.since = None if since is None else (int(since[0]), tuple(int(d) for d in since[1]))
            if "epoch" in value:
                self.state.carried = {int(value["epoch"]): (tuple(value["counts"]), tuple(value["before"]))}
        return self.decode(value)

    def _mine(self, epoch: int, *, counted: bool = True) -> dict[str, Any]:
        """What a mid-epoch position depends on beside the samples done: the sources, the epoch's counts
        (weights that round to the same counts serve the same samples), the draws' version, how each
        source is read."""
        mix = self.state.mix
        counts = {"counts": list(self.state.counts(epoch))} if counted else {}
        return {**mix.fingerprint, **counts, "order": MIX_ORDER, "streams": self.state.streams,
                "repeats": self.repeats}

    def save(self, offset: int, epoch: int = 0) -> dict[str, Any]:
        """The position with the mix's block: what a mid-epoch position depends on (at an epoch's start
        only the names, classes and epoch size: the weights of an epoch not begun are not asked for, a
        curriculum may end with the run), and each source's draws before this epoch."""
        mix = self.state.mix
        mine = self._mine(epoch) if offset else {**mix.fingerprint, "streams": self.state.streams,
                                                 "repeats": self.repeats}
        return {**super().save(offset, epoch), "mix": {
            **mine, "classes": list(mix.classes), "draws_before": dict(zip(mix.names, self.state.draws_before(epoch))),
            "weights_read": WEIGHTS_READ}}

    def restore(self, state: dict[str, Any]) -> int:
        """The position a state saved, its mix block checked whole first; mid-epoch, the epoch's counts
        it holds are the ones served (a weights function is not asked for them: Mix.replay)."""
        saved = refuse_single_state(state)
        epoch, mix = int(state["epoch"]), self.state.mix
        refuse_other_classes(saved["classes"], mix.classes)
        done = self.decode(state["samples_done"])
        if done > 0:
            saved = {**saved, "sources": carried_sources(saved["sources"], mix)}
            refuse_other_mix(saved, self._mine(epoch, counted=False))
            mix.replay(epoch, tuple(saved["counts"]))
            refuse_other_mix(saved, {"counts": list(self.state.counts(epoch))}, old="weights_read" not in saved)
        carried = saved["draws_before"]
        self.state.since = (epoch, tuple(int(carried.get(name, 0)) for name in mix.names))
        if max(self.state.since[1]) > MAX_DRAWS - self.state.per_epoch:
            raise ValueError(f"cannot resume: the state's mix['draws_before'] {shown(carried)} and this mix's "
                             f"epoch_size {mix.epoch_size} would take the draws past 2^62; resume from the state_dict() "
                             "the loader saved, unedited")
        state = {k: v for k, v in state.items() if k != "mix"}
        return super().restore(state)


def refuse_single_state(state: Any) -> dict[str, Any]:
    """A state saved over one dataset counts positions in that dataset's epoch, not a mix's; a mix's
    state is checked whole (mix.state.check_block) and its mix block returned."""
    if isinstance(state, dict) and "mix" not in state:
        raise ValueError("cannot resume: the state was saved by a loader over one dataset, this loader reads a "
                         "Mix; resume with the loader it was saved with")
    return check_block(state)


def refuse_other_classes(saved: list[str], mine: list[str]) -> None:
    """A model trained on the saved mix's label indices: a class that now has another index (the
    sources in another order, say) would silently change what a label means. New classes at the end
    are fine."""
    moved = [name for k, name in enumerate(saved) if k >= len(mine) or mine[k] != name]
    if moved:
        raise ValueError(f"cannot resume: the mix's classes changed order (class {shown(moved[0])} was label "
                         f"{saved.index(moved[0])}, it is {mine.index(moved[0]) if moved[0] in mine else 'gone'} now): "
                         "give the sources in the order they were saved with; new classes may only come after")


def carried_sources(saved: list[str], mix: Mix) -> list[str]:
    """The saved sources' fingerprints; a state saved before image folders had one holds Mix.fingerprint's
    stand-in 'PATH|RECORDS' for a folder: taken as the folder's fingerprint now, with a warning."""
    carried = list(saved)
    for k, dataset in enumerate(mix.datasets):
        if dataset.fingerprint and carried[k] == f"{dataset.path}|{len(dataset)}":
            log.warning("resuming mid-epoch over %s from a state without its fingerprint: not checked against changes "
                        "since it was saved", redact(dataset.path))
            carried[k] = dataset.fingerprint
    return carried


def refuse_other_mix(saved: dict[str, Any], mine: dict[str, Any], *, old: bool = False) -> None:
    """A mid-epoch position under another mix (sources, their records, weights, epoch size, draws'
    version) would serve other samples: one line naming the first difference. `old`: a state from
    before float weights were read as their decimals, whose counts may differ by that alone."""
    labels = {"names": "sources", "sources": "source records (a source re-converted or replaced, or a folder's "
                                             "files renamed, moved, added or removed)",
              "epoch_size": "epoch_size", "counts": "per-source counts (weights)", "order": "mix draws' version",
              "streams": "ways of reading the sources (sampling, interleave_shards)",
              "repeats": "aug_repeats (repeated augmentation)"}
    for key, label in labels.items():
        if key in mine and _differs(saved[key], mine[key]):
            why = OLD_WEIGHTS if old and key == "counts" else ""
            raise ValueError(f"cannot resume mid-epoch: the state was saved with other {label} ({shown(saved[key])}, "
                             f"this mix has {shown(mine[key])}){why}; resume at an epoch boundary to change them, or "
                             "with the mix it was saved with")


def _differs(saved: Any, mine: Any) -> bool:
    """A saved value (a list, which a state read back as tuples may hold) against this mix's."""
    return (list(saved) if isinstance(saved, (list, tuple)) else saved) != mine
