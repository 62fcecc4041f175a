"""Build a small sample in img2dataset's WebDataset layout: image-text shards with their sidecars.

    python tools/make_img2dataset_sample.py --out build/i2d [--shards 2] [--per-shard 8] [--failed 1]
        [--classes N] [--seed 0] [--overwrite]

What `img2dataset --output_format webdataset --caption_col ...` writes, made offline: each shard
`NNNNN.tar` holds, per image downloaded, `KEY.jpg` (a tiny JPEG), `KEY.json` (img2dataset's metadata:
url, key, caption, status, error_message, width, height, original_width, original_height, exif,
sha256; indented as img2dataset writes it) and `KEY.txt` (the caption), written by webdataset's
TarWriter as img2dataset does (its float mtime gives every member a PAX header); beside it
`NNNNN.parquet` (one metadata row per URL, failed downloads included, no image) and
`NNNNN_stats.json`. Keys are shard * 10^k + row, zero-padded like img2dataset's. Captions mix ASCII
and other UTF-8 text. `--classes N` adds a `KEY.cls` member (img2dataset writes none): one to three
class ids below N, several written "3 7" or "3,7" (multi-label). Deterministic from --seed.
"""
from __future__ import annotations

import argparse
import hashlib
import io
import json
import math
import shutil
import sys
from pathlib import Path

import numpy as np
from PIL import Image

WORDS = ("a", "red", "small", "photo", "of", "the", "dog", "cat", "on", "grass", "near", "sea", "café", "naïve",
         "東京", "🙂", "sunset", "\"quoted\"", "with", "line\nbreak")
START = 1_700_000_000.25  # a fixed download time: the same seed gives the same bytes
ERROR = "HTTP Error 404: Not Found"
META_TYPES = {"url": "string", "key": "string", "caption": "string", "status": "string", "error_message": "string",
              "width": "int64", "height": "int64", "original_width": "int64", "original_height": "int64",
              "exif": "string", "sha256": "string"}


def tiny_jpeg(rng: np.random.Generator) -> tuple[bytes, int, int]:
    """A small noisy JPEG (8..32 px a side) and its width and height."""
    w, h = (int(v) for v in rng.integers(8, 33, 2))
    base = rng.integers(0, 256, 3)
    pixels = np.clip(base + rng.normal(0, 24, (h, w, 3)), 0, 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=90)
    return out.getvalue(), w, h


def caption(rng: np.random.Generator) -> str:
    return " ".join(WORDS[int(i)] for i in rng.integers(0, len(WORDS), int(rng.integers(2, 8))))


def class_text(rng: np.random.Generator, classes: int) -> str:
    """A `.cls` body: one id, or two or three ids joined by a space or a comma."""
    ids = [int(i) for i in rng.choice(classes, size=min(classes, int(rng.integers(1, 4))), replace=False)]
    return (" " if rng.random() < 0.5 else ",").join(map(str, ids))


def shard_rows(shard: int, per_shard: int, failed: int, rng: np.random.Generator,
               classes: int) -> tuple[list[dict], list[dict]]:
    """The shard's samples (for the tar, in key order) and metadata rows (for the parquet, every URL)."""
    digits = 5 + max(1, math.ceil(math.log10(per_shard)))
    lost = set(int(i) for i in rng.choice(per_shard, size=min(failed, per_shard), replace=False))
    samples, rows = [], []
    for row in range(per_shard):
        key = f"{shard * 10 ** (digits - 5) + row:0{digits}d}"
        meta = {"url": f"https://images.example.com/{shard}/{row}.jpg", "key": key, "caption": caption(rng),
                "status": "failed_to_download", "error_message": ERROR, "width": None, "height": None,
                "original_width": None, "original_height": None, "exif": None, "sha256": None}
        if row not in lost:
            jpg, w, h = tiny_jpeg(rng)
            meta.update(status="success", error_message=None, width=w, height=h, original_width=w * 4,
                        original_height=h * 4, exif="{}", sha256=hashlib.sha256(jpg).hexdigest())
            sample = {"__key__": key, "jpg": jpg, "txt": meta["caption"], "json": json.dumps(meta, indent=4)}
            if classes:
                sample["cls"] = class_text(rng, classes)
            samples.append(sample)
        rows.append(meta)
    return samples, rows


def write_shard(out: Path, shard: int, samples: list[dict], rows: list[dict]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from webdataset import TarWriter

    name = f"{shard:05d}"
    with TarWriter(str(out / f"{name}.tar"), mtime=START + shard) as sink:
        for sample in samples:
            sink.write(sample)
    schema = pa.schema([(k, getattr(pa, t)()) for k, t in META_TYPES.items()])
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), out / f"{name}.parquet")
    ok = len(samples)
    stats = {"count": len(rows), "successes": ok, "failed_to_download": len(rows) - ok, "failed_to_resize": 0,
             "duration": 1.5, "start_time": START + shard, "end_time": START + shard + 1.5,
             "status_dict": {"success": ok, **({ERROR: len(rows) - ok} if len(rows) > ok else {})}}
    (out / f"{name}_stats.json").write_text(json.dumps(stats, indent=4))


def make(out: Path, *, shards: int = 2, per_shard: int = 8, failed: int = 1, classes: int = 0,
         seed: int = 0) -> list[dict]:
    """Write the sample into `out` (created); each image's sample as written (`__key__`, `jpg`,
    `txt`, `json` and `cls` when asked for, text as str), in shard and key order."""
    if shards < 1 or per_shard < 1 or failed < 0 or classes < 0:
        raise ValueError(f"--shards and --per-shard must be >= 1, --failed and --classes >= 0; got {shards}, "
                         f"{per_shard}, {failed}, {classes}")
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    written = []
    for shard in range(shards):
        samples, rows = shard_rows(shard, per_shard, failed, rng, classes)
        write_shard(out, shard, samples, rows)
        written += samples
    return written


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="the folder to write (shards, .parquet, _stats.json)")
    p.add_argument("--shards", type=int, default=2, help="number of shards (default 2)")
    p.add_argument("--per-shard", type=int, default=8, help="URLs per shard, failed ones included (default 8)")
    p.add_argument("--failed", type=int, default=1, help="failed downloads per shard: in the .parquet only (default 1)")
    p.add_argument("--classes", type=int, default=0, help="add KEY.cls members with ids below N (default 0: none)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    args = p.parse_args(argv)
    if args.out.exists():
        if not args.overwrite:
            print(f"{args.out} exists; pass --overwrite to replace it", file=sys.stderr)
            return 2
        shutil.rmtree(args.out)
    try:
        written = make(args.out, shards=args.shards, per_shard=args.per_shard, failed=args.failed,
                       classes=args.classes, seed=args.seed)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    print(f"wrote {len(written)} image-text samples in {args.shards} shards to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
