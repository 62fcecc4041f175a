"""What an unbroken loader serves with the trainer examples' options, per (rank, epoch, batch): the
yardstick the Ray Train and Ignite tests hold each trained step against."""
from __future__ import annotations

from collections import Counter

import datapipe
from tests.trainers.served import STEPS_PER_EPOCH, check_epochs

EPOCHS = 3
Served = dict[tuple[int, int, int], tuple[list[int], list[int], float]]  # (rank, epoch, batch 1..) -> batch


def unbroken(data, *, epochs: int = EPOCHS, image_size: int = 8) -> Served:
    """(indices, labels, pixel sum) of every batch of `epochs` epochs, 2 ranks, batch 4, on the CPU."""
    served: Served = {}
    for rank in (0, 1):
        loader = datapipe.make_loader(data, split="train", batch_size=4, train=True, image_size=image_size,
                                      rank=rank, world_size=2, device="cpu")
        for epoch in range(epochs):
            for batch, (images, labels, indices) in enumerate(loader, 1):
                served[rank, epoch, batch] = (indices.tolist(), labels.tolist(), round(float(images.sum()), 2))
    return served


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
