"""What checking the cache's content costs on this machine: the figures in docs/cache.md.

    python tools/cache_check_cost.py [--dir /tmp] [--records 1281167] [--repeats 3]

1. A cached shard re-checked on a process's first open: a read of the whole page-cached file alone
   (the floor of any content check), with zlib's crc32 (a cheaper checksum that would have to be
   recorded at download) and with sha256 (what the manifest already holds), for 64 and 256 MiB.
2. The shared folder index (datapipe/formats/folder_index.py) of an ImageNet-sized folder: its digest
   over the in-memory arrays (the scanning process), publishing it, and its digest again over the
   memory-mapped files (every other process that maps it). Median of `--repeats` runs each.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import tempfile
import time
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def timed(fn, repeats: int) -> float:
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - start)
    return statistics.median(runs)


def read_with(path: Path, kind: str) -> None:
    buf = bytearray(1 << 22)
    view, digest, crc = memoryview(buf), hashlib.sha256(), 0
    with open(path, "rb", buffering=0) as fh:
        while n := fh.readinto(buf):
            if kind == "sha256":
                digest.update(view[:n])
            elif kind == "crc32":
                crc = zlib.crc32(view[:n], crc)


def shard_checks(folder: Path, repeats: int) -> None:
    print("| file | read only | crc32 | sha256 |\n|---|---|---|---|")
    for mib in (64, 256):
        path = folder / f"shard-{mib}.bin"
        path.write_bytes(os.urandom(mib << 20))
        read_with(path, "read")  # in the page cache, as a cached copy being reopened is
        cells = []
        for kind in ("read", "crc32", "sha256"):
            seconds = timed(lambda: read_with(path, kind), repeats)
            cells.append(f"{seconds * 1000:.0f} ms ({mib / 1024 / seconds:.2f} GiB/s)")
        print(f"| {mib} MiB | " + " | ".join(cells) + " |")
        path.unlink()


def folder_index_checks(folder: Path, records: int, repeats: int) -> None:
    from datapipe.formats.folder_index import FIELDS, FolderIndex, arrays_digest

    index = FolderIndex.from_scan((f"n{i % 1000:08d}/n{i % 1000:08d}_{i:07d}.JPEG".encode(),
                                   f"n{i % 1000:08d}_{i:07d}", i % 1000) for i in range(records))
    size = sum(index.arrays[f].nbytes for f in FIELDS)
    in_memory = timed(lambda: arrays_digest(index.arrays), repeats)
    start = time.perf_counter()
    shared = index.shared(folder)
    publish = time.perf_counter() - start
    mapped = timed(lambda: FolderIndex.mapped(shared.folder, index.digest()), repeats)
    print(f"\nfolder index of {records:,} files ({size / 2**20:.0f} MiB of arrays): digest in memory "
          f"{in_memory * 1000:.0f} ms, published (written + renamed) in {publish * 1000:.0f} ms, mapped and "
          f"checked in {mapped * 1000:.0f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", default=None, help="a scratch folder on the disk to measure (default: $TMPDIR)")
    parser.add_argument("--records", type=int, default=1_281_167)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as scratch:
        shard_checks(Path(scratch), args.repeats)
        folder_index_checks(Path(scratch), args.records, args.repeats)


if __name__ == "__main__":
    main()
