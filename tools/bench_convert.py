"""Conversion throughput per format beside the PIL decode ceiling, on the same files, in one run.

    python tools/bench_convert.py build/sample [--repeats 3] [--workers N] [--json out.json]

The ceiling is one core's full PIL decode rate (open + RGB + load, from memory) times the cores:
what a converter that fully decoded every image could reach at best. Medians of --repeats runs.
"""
from __future__ import annotations

import argparse
import io
import json
import logging
import os
import statistics
import tempfile
import time
from pathlib import Path

from PIL import Image

from converters import ConvertOptions, convert
from datapipe.formats.scan import scan_folder


def full_decode_rate(paths: list[Path]) -> float:
    blobs = [p.read_bytes() for p in paths]
    started = time.perf_counter()
    for blob in blobs:
        Image.open(io.BytesIO(blob)).convert("RGB").load()
    return len(blobs) / (time.perf_counter() - started)


def conversion_rate(src: Path, suffix: str, workers: int, validate: str) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        options = ConvertOptions(workers=workers, validate=validate, progress=False)
        report = convert(src, Path(tmp) / f"out{suffix}", options)
    return report.images_per_s


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("src", type=Path)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    layout = scan_folder(args.src)
    paths = [f.path for files in layout.splits.values() for f in files if f.path.suffix == ".JPEG"]
    cores = os.cpu_count() or 1
    rows = {}
    for _ in range(args.repeats):  # interleave so drift on a shared machine hits every row alike
        rows.setdefault("pil_full_decode_x_cores", []).append(full_decode_rate(paths) * cores)
        for name, suffix in (("lmdb", ".lmdb"), ("hdf5", ".h5"), ("wds", ".wds")):
            for validate in ("decode", "fast"):
                rate = conversion_rate(args.src, suffix, args.workers, validate)
                rows.setdefault(f"convert_{name}_validate_{validate}", []).append(rate)
    medians = {k: statistics.median(v) for k, v in rows.items()}
    ceiling = medians["pil_full_decode_x_cores"]
    print(f"{len(paths)} JPEGs from {args.src}, {cores} cores, {args.workers} workers, median of {args.repeats}")
    print(f"{'row':34} {'img/s':>8} {'x ceiling':>10}")
    for name, value in medians.items():
        print(f"{name:34} {value:8.0f} {value / ceiling:10.2f}")
    if args.json:
        args.json.write_text(json.dumps({"cores": cores, "files": len(paths), "runs": rows, "median": medians}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
