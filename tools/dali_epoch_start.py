"""Time to the first batch of each epoch with the DALI backend (spawn start method by default, as
on a GPU): the cost a pipeline rebuild per epoch used to add, and what is left of it.

    python tools/dali_epoch_start.py build/demo/sample.lmdb --epochs 3 --workers 2 --repeats 3
"""
from __future__ import annotations

import argparse
import statistics
import time

from datapipe import make_loader


def first_batch_seconds(data: str, args: argparse.Namespace) -> list[float]:
    """Seconds from set_epoch to the first batch, per epoch, for one fresh loader."""
    loader = make_loader(data, backend="dali", batch_size=args.batch_size, image_size=args.image_size,
                         num_workers=args.workers, start_method=args.start_method)
    seconds = []
    for epoch in range(args.epochs):
        loader.set_epoch(epoch)
        started = time.perf_counter()
        batches = iter(loader)
        next(batches)
        seconds.append(time.perf_counter() - started)
        for _ in batches:
            pass
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--start-method", default="spawn", choices=["fork", "spawn"])
    args = parser.parse_args()
    runs = [first_batch_seconds(args.data, args) for _ in range(args.repeats)]
    for epoch in range(args.epochs):
        values = [run[epoch] for run in runs]
        print(f"epoch {epoch}: first batch after {statistics.median(values):.3f} s "
              f"(median of {args.repeats}; {', '.join(f'{v:.3f}' for v in values)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
