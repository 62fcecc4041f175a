"""The same `.wds` dataset from the local disk and from a loopback S3 server (moto), in one run.

    python tools/bench_remote.py build/demo/sample.wds [--repeats 3]

Starts moto's S3 server on 127.0.0.1 in a subprocess, uploads the dataset, then per repeat, rows
interleaved: one loader epoch (dataloader backend, shard-wise sampling for both) from the disk,
from S3 with an empty cache (every shard downloaded), and from S3 with the cache full. Then
`datapipe bench` over both sources in one run. Medians; ratios against the disk.
"""
from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_moto() -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            urllib.request.urlopen(endpoint, timeout=1).close()
            break
        except OSError:
            time.sleep(0.1)
    return proc, endpoint


def epoch_seconds(source: str, cache: Path | None, size: int, workers: int) -> float:
    from datapipe import make_loader

    loader = make_loader(source, backend="dataloader", batch_size=64, image_size=size, device="cpu",
                         num_workers=workers, sampling="shards", cache_dir=str(cache) if cache else None)
    loader.set_epoch(0)
    start = time.perf_counter()
    for _ in loader:
        pass
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dataset", type=Path)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    proc, endpoint = start_moto()
    scratch = Path(tempfile.mkdtemp(prefix="datapipe-remote-bench-"))
    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1",
                      AWS_ENDPOINT_URL=endpoint, TMPDIR=str(scratch))
    try:
        urllib.request.urlopen(urllib.request.Request(f"{endpoint}/bench", method="PUT")).close()
        url = f"s3://bench/{args.dataset.name}"
        from datapipe.storage import RemoteStore

        store = RemoteStore(url)
        for f in sorted(args.dataset.iterdir(), key=lambda p: p.name == "manifest.json"):
            store.upload(f.name, f)
        rows: dict[str, list[float]] = {"disk": [], "s3, empty cache": [], "s3, full cache": []}
        warm = scratch / "warm"
        for _ in range(args.repeats):
            rows["disk"].append(epoch_seconds(str(args.dataset), None, args.image_size, args.workers))
            cold = scratch / "cold"
            shutil.rmtree(cold, ignore_errors=True)
            rows["s3, empty cache"].append(epoch_seconds(url, cold, args.image_size, args.workers))
            rows["s3, full cache"].append(epoch_seconds(url, warm, args.image_size, args.workers))
        base = statistics.median(rows["disk"])
        print(f"one epoch of {args.dataset} (dataloader, {args.workers} workers, {args.image_size}px), "
              f"median of {args.repeats}:")
        for name, runs in rows.items():
            med = statistics.median(runs)
            print(f"  {name:16} {med:7.2f} s  x{base / med:.2f} of disk  runs {' '.join(f'{r:.2f}' for r in runs)}")
        subprocess.run([sys.executable, "-m", "datapipe", "bench", str(args.dataset), url, "--suites", "read,pipeline",
                        "--backends", "dataloader", "--seconds", "3", "--repeats", str(args.repeats),
                        "--image-size", str(args.image_size), "--sampling", "shards", "--cache-dir", str(warm)],
                       check=True)
    finally:
        proc.terminate()
        proc.wait()
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    raise SystemExit(main())
