"""How well shard-wise sampling mixes shards written class by class: the mean total-variation distance
between a batch's label histogram and the dataset's, per ShardOrder.interleave_shards, against a full random
permutation (global sampling), for a fresh epoch and for the rest of one resumed on another world size.

    python tools/shard_mixing.py [--shards 64 --per-shard 32 --classes 8 --world 2 --batch 32 --epochs 8]
        [--mixes 1,4,8,16,32]

A block of interleave_shards shards is what a rank holds in its cache at once (about twice that), so the
table is the trade between balance and cache space; bigger batches need bigger blocks.
"""
from __future__ import annotations

import argparse

import numpy as np

from datapipe.order.sharding import INTERLEAVE_SHARDS, Shard, ShardOrder


def mean_tv(labels: np.ndarray, per_rank: list[np.ndarray], batch: int, classes: int) -> float:
    whole = np.bincount(labels, minlength=classes) / len(labels)
    return float(np.mean([0.5 * np.abs(np.bincount(labels[m[i:i + batch]], minlength=classes) / batch - whole).sum()
                          for m in per_rank for i in range(0, len(m) - batch + 1, batch)]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    defaults = {"shards": 64, "per-shard": 32, "classes": 8, "world": 2, "batch": 32, "epochs": 8}
    for name, default in defaults.items():
        parser.add_argument(f"--{name}", type=int, default=default)
    parser.add_argument("--mixes", default="1,4,8,16,32", help="interleave_shards values to measure, comma-separated")
    a = parser.parse_args()
    sizes = (a.per_shard,) * a.shards
    labels = np.repeat(np.arange(a.shards) * a.classes // a.shards, a.per_shard)  # written class by class
    other = a.world + 1  # the elastic case: resumed after 7 batches on one more rank

    def orders(world: int, mix: int) -> list[ShardOrder]:
        return [ShardOrder(sizes, a.batch, Shard(r, world), seed=5, interleave_shards=mix) for r in range(world)]

    def random(world: int) -> float:
        return float(np.mean([mean_tv(labels, [np.random.default_rng([99, e]).permutation(len(labels))[r::world]
                                               for r in range(world)], a.batch, a.classes) for e in range(a.epochs)]))

    base, base_other = random(a.world), random(other)
    print(f"random permutation: {base:.4f} ({a.world} ranks), {base_other:.4f} ({other} ranks)")
    print("interleave_shards  fresh epoch        rest after resume on " f"{a.world} -> {other} ranks")
    for mix in sorted({INTERLEAVE_SHARDS, *(int(m) for m in a.mixes.split(","))}):
        fresh = np.mean([mean_tv(labels, [p.rank_indices(e) for p in orders(a.world, mix)], a.batch, a.classes)
                         for e in range(a.epochs)])
        position = orders(a.world, mix)[0].offset_after((), 7)
        rest = np.mean([mean_tv(labels, [p.rank_indices(e, position) for p in orders(other, mix)], a.batch, a.classes)
                        for e in range(a.epochs)])
        mark = "  (default)" if mix == INTERLEAVE_SHARDS else ""
        print(f"{mix:>10}  {fresh:.4f} ({fresh / base:.2f}x)    {rest:.4f} ({rest / base_other:.2f}x){mark}")


if __name__ == "__main__":
    main()
