"""The trainer tests' Mix (issue #40): the packed fixture as LMDB ("lm") and as .wds ("wd"), weights
2:1 over an epoch of 27 samples, the single dataset's size, so an epoch is still 4 batches a rank at
world size 2 and batch 4 (served.STEPS_PER_EPOCH). "lm" gives 18 samples an epoch, fewer than its 27
records: it goes on next epoch where it stopped (the draws before an epoch count); "wd" gives 9. The
two hold the same images: (source, record) tells them apart, and their crops differ.

What every rank served is held against the mix's own uninterrupted sequence, one loader on one
rank, at the positions sharding.RankBatch gives each rank at its world size; that is how a run
resumed at another world size is checked sample by sample.
"""
from __future__ import annotations

import math
from collections import Counter

import datapipe
from tests.trainers.served import MID_STEP, STEPS_PER_EPOCH

WEIGHTS = {"lm": 2.0, "wd": 1.0}
EPOCH_SIZE = 27
FIELDS = ("image", "label", "source")
Sample = tuple[str, int, int, float]  # (source, record inside it, label in mix.classes, pixel sum)


def mix_spec(lmdb, wds) -> str:
    """A trainer script's DATA argument for the tests' mix."""
    return f"mix:lm={lmdb},wd={wds}"


def data_of(arg: str):
    """A script's DATA: a dataset path as it is, or `mix:NAME=PATH,...`, the tests' Mix of those sources."""
    if not arg.startswith("mix:"):
        return arg
    return datapipe.Mix(dict(part.split("=", 1) for part in arg[4:].split(",")), weights=WEIGHTS,
                        epoch_size=EPOCH_SIZE)


def batch_log(batch, loader) -> dict:
    """What a script logs of a batch over the mix: each sample's source, record, label and pixel sum."""
    return {"sources": [loader.mix.names[s] for s in batch.sources.tolist()], "labels": batch.labels.tolist(),
            "sample_pixels": [round(float(p), 2) for p in batch.images.sum(dim=(1, 2, 3))]}


def logged(record: dict) -> list[Sample]:
    return list(zip(record["sources"], record["indices"], record["labels"], record["sample_pixels"]))


def sequence_of(mix: datapipe.Mix, *, epochs: int, image_size: int) -> list[list[Sample]]:
    """Per epoch, the mix's samples in the order of its global positions: one loader on one rank,
    never resumed, with the trainer scripts' options."""
    loader = datapipe.make_loader(mix, split="train", batch_size=4, train=True, image_size=image_size,
                                  fields=FIELDS, rank=0, world_size=1, device="cpu", backend="threads")
    return [[s for b in loader for s in logged({**batch_log(b, loader), "indices": b.indices.tolist()})]
            for _ in range(epochs)]


def positions(rank: int, world: int, start: int = 0, size: int = EPOCH_SIZE) -> list[int]:
    """The global positions `rank` of `world` reads from `start` to the end of an epoch: its m-th is
    start + rank + m x world; past the end, padding wraps around to the epoch's first positions."""
    rest = size - start
    places = [rank + m * world for m in range(math.ceil(rest / world))]
    return [start + j if j < rest else (j - rest) % size for j in places]


def check_sequence(mix: datapipe.Mix, sequence: list[list[Sample]]) -> None:
    """The yardstick itself: each epoch holds each source's exact count, each source's records come
    once before any repeats, across epochs (a source goes on where it stopped), and each label is
    its record's class name in mix.classes."""
    opened = dict(zip(mix.names, mix.datasets))
    drawn: dict[str, list[int]] = {name: [] for name in mix.names}
    for epoch, samples in enumerate(sequence):
        assert Counter(s[0] for s in samples) == dict(zip(mix.names, mix.counts(epoch))), epoch
        for name, record, label, _ in samples:
            drawn[name].append(record)
            assert mix.classes[label] == opened[name].classes[opened[name][record].label], (name, record)
    for name, records in drawn.items():  # "lm"'s first 27 draws span epochs 0 and 1
        size = len(opened[name])
        for cycle in range(0, len(records), size):
            chunk = records[cycle:cycle + size]
            assert len(set(chunk)) == len(chunk), f"{name} repeats a record before all came"


def check_served(served: list[Sample], expected: list[Sample], padding: int) -> None:
    """An epoch's samples served by all ranks together: the uninterrupted run's, none missing, and
    beyond them only `padding` repeats (the last batches' padding at the world size served)."""
    got, want = Counter(served), Counter(expected)
    assert not want - got, f"never served: {sorted(want - got)}"
    assert sum((got - want).values()) == padding, f"served twice: {sorted(got - want)}"


def epoch_samples(records: list[dict], epoch: int) -> list[Sample]:
    return [s for r in records if r.get("epoch") == epoch and "indices" in r for s in logged(r)]


def check_resumed(sequence: list[list[Sample]], before: dict[int, list[dict]], after: dict[int, list[dict]]) -> None:
    """`before`: per rank, what a run at world size 2 served until it was saved and stopped at step
    MID_STEP (epoch 1 after 2 of its 4 batches); `after`: per rank, what its resumption served at
    world size len(after). Each rank's samples are the uninterrupted sequence's at its positions,
    and each epoch's, all ranks together, are the sequence's, none lost, none twice but the padding."""
    done = (MID_STEP - STEPS_PER_EPOCH) * 4 * 2  # the global position saved: 2 batches of 4 on 2 ranks
    served: dict[int, list[Sample]] = {e: [] for e in range(len(sequence))}
    for rank, records in before.items():
        for epoch, reads in ((0, positions(rank, 2)), (1, positions(rank, 2)[:done // 2])):
            got = epoch_samples(records, epoch)
            assert got == [sequence[epoch][p] for p in reads], (rank, epoch)
            served[epoch] += got
    world = len(after)
    for rank, records in after.items():
        for epoch, start in ((1, done), *((e, 0) for e in range(2, len(sequence)))):
            got = epoch_samples(records, epoch)
            assert got == [sequence[epoch][p] for p in positions(rank, world, start)], (rank, epoch, world)
            served[epoch] += got
    padding = {0: 2 * math.ceil(EPOCH_SIZE / 2) - EPOCH_SIZE,
               1: world * math.ceil((EPOCH_SIZE - done) / world) - (EPOCH_SIZE - done),
               **{e: world * math.ceil(EPOCH_SIZE / world) - EPOCH_SIZE for e in range(2, len(sequence))}}
    for epoch, samples in served.items():
        check_served(samples, sequence[epoch], padding[epoch])
