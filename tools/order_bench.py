"""The epoch order, stored vs computed (#33): per dataset size, the time and peak memory (tracemalloc)
to start an epoch on one rank of eight and take its first batch, with the order stored (a numpy
permutation of every record, as before) and computed (datapipe.order.permutation), globally and shard-wise
(shards of 10,000 records, blocks of 16 shards); the cost of one batch of 256 keys computed anywhere
in the epoch; and how far cycle-walking goes.

    python tools/order_bench.py [--sizes 1e6,1e7,1e8] [--stored-up-to 1e7] [--json FILE]

Medians of --runs runs (the stored order: one run past 10^7, it takes seconds and gigabytes).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
import tracemalloc

import numpy as np

from datapipe.order.permutation import Permutation, derive_key
from datapipe.order.sharding import EpochOrder, Shard, ShardOrder

BATCH, WORLD, RANK = 256, 8, 3
SHARD = 10_000  # records a shard, shard-wise


def stored_first_batch(size: int, epoch: int) -> np.ndarray:
    """The order as it was stored before #33: the whole permutation, then the rank's slice of it."""
    order = np.random.default_rng([0, epoch]).permutation(size).astype(np.int64)
    mine = order[RANK::WORLD]
    return mine[:BATCH]


def computed_first_batch(size: int, epoch: int) -> np.ndarray:
    return EpochOrder(size, BATCH, Shard(RANK, WORLD), seed=0).batches(epoch)[0]


def shardwise_first_batch(size: int, epoch: int) -> np.ndarray:
    return ShardOrder((SHARD,) * (size // SHARD), BATCH, Shard(RANK, WORLD), seed=0).batches(epoch)[0]


def measure(start, size: int, runs: int) -> tuple[float, int]:
    """(median seconds, peak bytes traced) of start(size, epoch) over `runs` epochs."""
    seconds, peak = [], 0
    for epoch in range(runs):
        tracemalloc.start()
        began = time.perf_counter()
        start(size, epoch)
        seconds.append(time.perf_counter() - began)
        peak = max(peak, tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
    return statistics.median(seconds), peak


def batch_cost(size: int, count: int = 2000) -> float:
    """Median microseconds to compute one batch of 256 keys, batches spread over the whole epoch."""
    batches = EpochOrder(size, BATCH, Shard(RANK, WORLD), seed=0).batches(1)
    numbers = np.linspace(0, len(batches) - 1, count).astype(int)
    times = []
    for n in numbers:
        began = time.perf_counter()
        batches[int(n)]
        times.append(time.perf_counter() - began)
    return statistics.median(times) * 1e6


def walk_lengths(size: int, sample: int = 10**6) -> tuple[float, int]:
    """(mean, max) passes through the network over `sample` positions (cycle-walking)."""
    perm = Permutation(size, derive_key(0, 1))
    x = perm._forward(np.arange(min(size, sample), dtype=np.uint64))  # noqa: SLF001 (counting passes)
    passes = np.ones(len(x), np.int64)
    todo = np.flatnonzero(x >= size)
    while todo.size:
        x[todo] = perm._forward(x[todo])  # noqa: SLF001
        passes[todo] += 1
        todo = todo[x[todo] >= size]
    return float(passes.mean()), int(passes.max())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1e6,1e7,1e8")
    parser.add_argument("--stored-up-to", type=float, default=1e7, help="measure the stored order up to this size")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", help="write the rows here too")
    a = parser.parse_args()
    rows = []
    print(f"{'records':>12} {'stored s':>9} {'stored MiB':>11} {'computed s':>11} {'computed KiB':>13} "
          f"{'batch us':>9} {'passes':>12} {'shard-wise s':>13} {'shard-wise MiB':>15}")
    for size in (int(float(s)) for s in a.sizes.split(",")):
        runs = a.runs if size <= 10**7 else 1
        stored = measure(stored_first_batch, size, runs) if size <= a.stored_up_to else (float("nan"), 0)
        computed = measure(computed_first_batch, size, a.runs)
        mean, worst = walk_lengths(size)
        shardwise = measure(shardwise_first_batch, size, a.runs)
        row = {"records": size, "stored_s": stored[0], "stored_bytes": stored[1], "computed_s": computed[0],
               "computed_bytes": computed[1], "batch_us": batch_cost(size), "passes_mean": mean, "passes_max": worst,
               "shardwise_s": shardwise[0], "shardwise_bytes": shardwise[1]}
        rows.append(row)
        print(f"{size:>12,} {row['stored_s']:>9.3f} {row['stored_bytes'] / 2**20:>11.1f} {row['computed_s']:>11.5f} "
              f"{row['computed_bytes'] / 2**10:>13.1f} {row['batch_us']:>9.0f} {mean:>7.2f}/{worst:<4} "
              f"{shardwise[0]:>13.3f} {shardwise[1] / 2**20:>15.1f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
