"""What an unbroken loader serves with the trainer examples' options, per (rank, epoch, batch): the
yardstick the Ray Train and Ignite tests hold each trained step against."""
from __future__ import annotations

from collections import Counter

import datapipe
from tests.trainers.mixed import FIELDS, check_sequence, check_served, positions, sequence_of
from tests.trainers.served import STEPS_PER_EPOCH, check_epochs

EPOCHS = 3
# (rank, epoch, batch 1..) -> (indices, labels, pixel sum, each sample's source over a Mix, else None)
Served = dict[tuple[int, int, int], tuple[list[int], list[int], float, "list[str] | None"]]


def unbroken(data, *, epochs: int = EPOCHS, image_size: int = 8) -> Served:
    """(indices, labels, pixel sum, sources) of every batch of `epochs` epochs, 2 ranks, batch 4, on the CPU."""
    served: Served = {}
    mix = data if isinstance(data, datapipe.Mix) else None
    fields = FIELDS if mix else ("image", "label")
    for rank in (0, 1):
        loader = datapipe.make_loader(data, split="train", batch_size=4, train=True, image_size=image_size,
                                      rank=rank, world_size=2, device="cpu", fields=fields)
        for epoch in range(epochs):
            for number, batch in enumerate(loader, 1):
                sources = [mix.names[s] for s in batch.sources.tolist()] if mix else None
                served[rank, epoch, number] = (batch.indices.tolist(), batch.labels.tolist(),
                                               round(float(batch.images.sum()), 2), sources)
    return served


def check_mix_coverage(served: Served, mix: datapipe.Mix, image_size: int = 8) -> None:
    """The yardstick over a Mix: each rank's (source, record, label) are the mix's uninterrupted
    sequence (tests.trainers.mixed) at the positions it reads at world size 2; each epoch, both ranks
    together, the sequence's samples, none lost, none twice but the one padding (27 over 2 ranks)."""
    sequence = sequence_of(mix, epochs=EPOCHS, image_size=image_size)
    check_sequence(mix, sequence)
    for epoch, samples in enumerate(sequence):
        both = []
        for rank in (0, 1):
            batches = [served[rank, epoch, b] for b in range(1, STEPS_PER_EPOCH + 1)]
            got = [(s, i, label) for indices, labels, _, sources in batches
                   for s, i, label in zip(sources, indices, labels)]
            assert got == [samples[p][:3] for p in positions(rank, 2)], (rank, epoch)
            both += got
        check_served(both, [s[:3] for s in samples], padding=1)


def check_coverage(served: Served, size: int) -> None:
    """The yardstick itself: each epoch complete, disjoint across ranks and new (tests.trainers.served)."""
    ranks = {rank: [{"epoch_start": 0, "len": STEPS_PER_EPOCH, "world": 2}] +
             [{"epoch": e, "indices": b[0]} for (r, e, _), b in sorted(served.items()) if r == rank] for rank in (0, 1)}
    check_epochs(ranks, size, EPOCHS)


def each_once(trained: list[tuple[int, int, int]], served: Served) -> None:
    """`trained`: the (rank, epoch, batch) of every step of a run and its resumption: every batch of
    the unbroken run once, none twice, none lost."""
    counts = Counter(trained)
    assert sorted(counts) == sorted(served) and set(counts.values()) == {1}, sorted(set(served) ^ set(counts))
