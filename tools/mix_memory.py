"""A rank's private memory inside an epoch of a Mix, against its records: two sparse sources (HDF5 of N
records, .wds of N/4; tools/sparse_datasets.py), N = 200,000 and 2,000,000 by default, each measured in
a fresh process.

    python tools/mix_memory.py --out /tmp/mixmem [--records 200000,2000000] [--repeats 3] [--json FILE]

Per run: the process's dirty private pages (/proc/self/smaps_rollup) before the Mix is opened, then
after: the open (Mix + the loader's concatenation), the order of rank 3 of 8 at epoch 5 (four epochs'
draws before it, weights changing every epoch), and 200 of its batches of 256 (the first 100 and 100
from the middle of the epoch). The same for one dataset (the HDF5 source alone, EpochOrder) as the
baseline. B/record: the growth over the records of all sources. The sources' bytes are never read (an
order reads none), so the holes of the sparse datasets cost nothing.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sparse_datasets import build_sparse  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, sys
def private():
    fields = dict(line.split(":", 1) for line in open("/proc/self/smaps_rollup") if ":" in line)
    return sum(int(fields[k].split()[0]) * 1024 for k in ("Private_Dirty",) if k in fields)
import numpy as np, datapipe
from datapipe.mix.sources import Mix
from datapipe.mix.dataset import MixDataset
from datapipe.mix.order import MixOrder, MixState
from datapipe.order.sharding import EpochOrder, Shard
from datapipe.formats import open_dataset
kind, big, web = sys.argv[1:4]
before = private()
if kind == "mix":
    mix = Mix({"big": big, "web": web}, weights=lambda e: {"big": 1.0, "web": 0.25 + 0.1 * e})
    dataset = MixDataset(mix)
    order = MixOrder(mix.epoch_size, 256, Shard(3, 8), 0, state=MixState(mix))
    records = sum(mix.sizes)
else:
    dataset = open_dataset(big)
    order = EpochOrder(len(dataset), 256, Shard(3, 8), 0)
    records = len(dataset)
opened = private()
epoch = 5
start = order.batches(epoch, 0)
middle = order.batches(epoch, order.size // 2)
keys = 0
for batches in (start, middle):
    for b in batches[:100]:
        keys += len(b)
done = private()
print(json.dumps({"kind": kind, "records": records, "open_bytes": opened - before, "epoch_bytes": done - before,
                  "keys": keys}))
"""


def measure(kind: str, big: Path, web: Path) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, kind, str(big), str(web)], capture_output=True, text=True,
                         check=True, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--records", default="200000,2000000")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = []
    args.out.mkdir(parents=True, exist_ok=True)
    for n in (int(x) for x in args.records.split(",")):
        big, web = args.out / f"big-{n}.h5", args.out / f"web-{n // 4}.wds"
        if not big.exists():
            build_sparse("hdf5", big, n, 256)
        if not web.exists():
            build_sparse("wds", web, n // 4, 256)
        for kind in ("mix", "one"):
            runs = [measure(kind, big, web) for _ in range(args.repeats)]
            median = {k: statistics.median(r[k] for r in runs) for k in ("open_bytes", "epoch_bytes")}
            rows.append({"kind": kind, "records": runs[0]["records"], **median,
                         "bytes_per_record": median["epoch_bytes"] / runs[0]["records"], "runs": runs})
    print(f"{'kind':5} {'records':>10} {'open MB':>8} {'epoch MB':>9} {'B/record':>9}")
    for r in rows:
        print(f"{r['kind']:5} {r['records']:>10,} {r['open_bytes'] / 2**20:>8.2f} {r['epoch_bytes'] / 2**20:>9.2f} "
              f"{r['bytes_per_record']:>9.3f}")
    for kind in ("mix", "one"):
        mine = [r for r in rows if r["kind"] == kind]
        if len(mine) > 1:  # what each record more costs: the growth between the smallest and largest sources
            slope = (mine[-1]["epoch_bytes"] - mine[0]["epoch_bytes"]) / (mine[-1]["records"] - mine[0]["records"])
            print(f"{kind}: {slope:+.4f} B per additional record ({mine[0]['records']:,} -> {mine[-1]['records']:,})")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
