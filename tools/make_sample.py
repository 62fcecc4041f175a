"""Build a sample ImageNet-layout dataset from fixtures/: ImageNet-size JPEGs, learnable classes.

    python tools/make_sample.py --out build/sample [--per-class 200] [--size 500x375] [--overwrite]

Each class's images are random crops of that class's fixture pictures, upscaled and given
photo-like texture and noise, so they decode and compress like ImageNet JPEGs (~500x375, q90) and a
model can learn the classes. The fixture's awkward files (CMYK, 16-bit, alpha, EXIF) and bad files
(truncated, empty, not an image) are copied into train so the demo shows the skip report.
"""
from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import numpy as np
from PIL import Image

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "imagefolder"
EXTRAS = ("cat/cmyk.jpg", "cat/exif_rotated.jpg", "cat/truncated.jpg", "dog/gray16.png", "dog/rgba.png",
          "dog/empty.jpg", "dog/text.jpg")


def base_pictures(cls_dir: Path, size: tuple[int, int]) -> list[np.ndarray]:
    """The class's fixture pictures upscaled to twice the output size (crops come from these)."""
    w, h = size
    return [np.asarray(Image.open(p).convert("RGB").resize((2 * w, 2 * h), Image.Resampling.BICUBIC),
                       dtype=np.float32) for p in sorted(cls_dir.glob("*_0*.jpg"))]


def texture(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """Low-contrast multi-scale detail so the JPEGs carry photo-like entropy."""
    out = np.zeros((h, w, 1), np.float32)
    for cells in (8, 32, 96):
        coarse = rng.normal(0, 1, (cells * h // w + 1, cells, 1)).astype(np.float32)
        grid = Image.fromarray(coarse[..., 0]).resize((w, h), Image.Resampling.BICUBIC)
        out += np.asarray(grid, np.float32)[..., None] * (24 / cells ** 0.3)
    return out


def sample_image(base: np.ndarray, rng: np.random.Generator, size: tuple[int, int]) -> Image.Image:
    w, h = size
    scale = rng.uniform(0.5, 1.0)
    cw, ch = int(base.shape[1] * scale), int(base.shape[0] * scale)
    x, y = rng.integers(0, base.shape[1] - cw + 1), rng.integers(0, base.shape[0] - ch + 1)
    crop = Image.fromarray(base[y:y + ch, x:x + cw].astype(np.uint8)).resize((w, h), Image.Resampling.BILINEAR)
    pixels = np.asarray(crop, np.float32) + texture(rng, h, w) + rng.normal(0, 11, (h, w, 3))
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


def make(out: Path, per_class: int, size: tuple[int, int], seed: int, extras: bool = True) -> int:
    rng = np.random.default_rng(seed)
    classes = sorted(p.name for p in (FIXTURES / "train").iterdir() if p.is_dir())
    count = 0
    for cls in classes:
        bases = base_pictures(FIXTURES / "train" / cls, size)
        for split, n in (("train", per_class), ("val", max(1, per_class // 5))):
            folder = out / split / cls
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(n):
                img = sample_image(bases[int(rng.integers(len(bases)))], rng, size)
                img.save(folder / f"{cls}_{split}_{i:05d}.JPEG", "JPEG", quality=90)
                count += 1
    for extra in EXTRAS if extras else ():
        shutil.copy(FIXTURES / "train" / extra, out / "train" / extra)
    return count


def clear_output(out: Path, overwrite: bool) -> bool:
    """Remove an existing output folder if --overwrite was given; False (and a message) if not."""
    if out.exists():
        if not overwrite:
            print(f"{out} exists; pass --overwrite to rebuild it", file=sys.stderr)
            return False
        shutil.rmtree(out)
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--per-class", type=int, default=200, help="train images per class (val gets 1/5)")
    parser.add_argument("--size", default="500x375", help="WIDTHxHEIGHT (default ImageNet's typical 500x375)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out folder")
    parser.add_argument("--no-extras", action="store_true",
                        help="leave out the awkward and bad fixture files (for benchmarking folders)")
    args = parser.parse_args()
    if not clear_output(args.out, args.overwrite):
        return 2
    w, h = (int(v) for v in args.size.lower().split("x"))
    n = make(args.out, args.per_class, (w, h), args.seed, extras=not args.no_extras)
    extras = "" if args.no_extras else f" (+{len(EXTRAS)} awkward/bad fixture files)"
    print(f"wrote {n} images{extras} to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
