"""Build an ImageNet-sized corpus in ImageNet's layout for the peer comparison (tools/compare_peers.py).

    python tools/make_imagenet_like.py --out build/imagenet-like [--images 3000] [--classes 20] [--overwrite]

ImageNet (ILSVRC-2012 train, 1,281,167 JPEGs, ~138 GB) as published and as quoted in issue #23 (not
measured here: ImageNet is not reachable from this machine): most pictures are Flickr "medium"
sizes with a 500 px longer side (500x375 is the mode, 500x333 next), median ~0.18 MP, mean about
400x350 px (the often quoted 469x387 counts the val/test sets too), ~110 KB a file on average, and
a tail of larger uploads up to ~4 MP. Pictures here follow that: 60% with a 500 px longer side,
27% smaller (160-499 px), 10% 501-1600 px, 3% up to 4 MP, in ImageNet's aspect ratios (4:3 and 3:2
mostly, ~20% portrait). The pictures themselves are tools/make_sample.py's
photo-like synthetic crops (fixture photos + texture + noise, plus luminance grain for ImageNet's bytes per pixel: no real photos are reachable from
this machine), encoded by tools/make_webmix.py's mix: ~15% awkward files (CMYK, palette and RGBA
PNGs, EXIF-rotated, grayscale; progressive and 4:4:4 JPEGs among the rest), all named
CLASS_N.JPEG as ImageNet does (which holds a PNG and CMYK files under that name too), and the
fixture's four bad files copied in. Prints the corpus's size distribution beside ImageNet's.
"""
from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import numpy as np
from PIL import Image, ImageFile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tools.make_sample import FIXTURES, base_pictures, clear_output, sample_image  # noqa: E402
from tools.make_webmix import BAD, encode, pick_kind  # noqa: E402

# ImageNet train as published (issue #23): median MP, mean KB, the tail's largest MP
IMAGENET = {"median_mp": 0.18, "mean_kb": 110, "max_mp": 4.0}
# (share, smallest, largest longer side): ImageNet's Flickr sizes
LONG_SIDES = ((0.60, 500, 500), (0.27, 160, 499), (0.10, 501, 1600), (0.03, 1601, 2309))
# width:height -> share; portrait about a fifth, as ImageNet
ASPECTS = {4 / 3: 0.45, 3 / 2: 0.22, 1.0: 0.07, 16 / 9: 0.06, 3 / 4: 0.12, 2 / 3: 0.08}
MAX_PIXELS = 4_000_000
GRAIN = 12.0
# a grainy progressive JPEG outgrows Pillow's default one-pass buffer ("Suspension not allowed here")
ImageFile.MAXBLOCK = 1 << 25


def picture_size(rng: np.random.Generator) -> tuple[int, int]:
    """(width, height) drawn from ImageNet's mix of longer sides and aspect ratios, at most 4 MP."""
    shares = [s for s, _, _ in LONG_SIDES]
    _, low, high = LONG_SIDES[int(rng.choice(len(LONG_SIDES), p=shares))]
    long = int(np.exp(rng.uniform(np.log(low), np.log(high)))) if high > low else low
    aspect = float(rng.choice(list(ASPECTS), p=list(ASPECTS.values())))
    w, h = (long, round(long / aspect)) if aspect >= 1 else (round(long * aspect), long)
    shrink = min(1.0, (MAX_PIXELS / (w * h)) ** 0.5)
    return int(w * shrink), int(h * shrink)


def grain(img: Image.Image, rng: np.random.Generator, sigma: float = GRAIN) -> Image.Image:
    """Luminance film grain: the fine detail that brings the JPEGs to ImageNet's bytes per pixel
    (make_sample's pictures alone compress to about half of them)."""
    pixels = np.asarray(img, np.float32) + rng.normal(0, sigma, (img.height, img.width, 1)).astype(np.float32)
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


def class_names(classes: int) -> list[str]:
    """WordNet-id-like folder names, as ImageNet's n01440764..."""
    return [f"n{1440764 + 7919 * k:08d}" for k in range(classes)]


def make(out: Path, images: int, classes: int, seed: int) -> list[tuple[int, int, bool]]:
    """Write the corpus; return each picture's (pixels, bytes, is a JPEG)."""
    rng = np.random.default_rng(seed)
    fixture_classes = sorted(p.name for p in (FIXTURES / "train").iterdir() if p.is_dir())
    bases = {c: base_pictures(FIXTURES / "train" / c, (400, 300)) for c in fixture_classes}
    names, stats = class_names(classes), []
    for i in range(images):
        cls = names[i % classes]
        pictures = bases[fixture_classes[i % classes % len(fixture_classes)]]
        size = picture_size(rng)
        picture = grain(sample_image(pictures[int(rng.integers(len(pictures)))], rng, size), rng)
        data, ext = encode(picture, pick_kind(rng), rng)
        folder = out / "train" / cls
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{cls}_{i}.JPEG").write_bytes(data)
        stats.append((size[0] * size[1], len(data), ext == "jpg"))
    for k, bad in enumerate(BAD):
        shutil.copy(FIXTURES / "train" / bad, out / "train" / names[k % classes] / Path(bad).name)
    return stats


def distribution(stats: list[tuple[int, int, bool]]) -> str:
    """The corpus's median/p90/max megapixels and mean KB beside ImageNet's published figures."""
    mp = np.array([p for p, _, _ in stats]) / 1e6
    kb = np.array([b for _, b, _ in stats]) / 1e3
    jpeg_kb = np.array([b for _, b, jpeg in stats if jpeg]) / 1e3
    return (f"this corpus: median {np.median(mp):.3f} MP, p90 {np.percentile(mp, 90):.2f} MP, max {mp.max():.2f} MP, "
            f"mean {kb.mean():.0f} KB (median {np.median(kb):.0f} KB; JPEGs alone mean {jpeg_kb.mean():.0f} KB)\n"
            f"ImageNet train (published): median ~{IMAGENET['median_mp']} MP (500x375 the mode), tail to "
            f"~{IMAGENET['max_mp']:.0f} MP, mean ~{IMAGENET['mean_kb']} KB")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--images", type=int, default=3000)
    parser.add_argument("--classes", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out folder")
    args = parser.parse_args()
    if not 1 <= args.classes <= args.images:
        parser.error(f"--classes {args.classes}: give 1 to --images ({args.images}) classes")
    if not clear_output(args.out, args.overwrite):
        return 2
    stats = make(args.out, args.images, args.classes, args.seed)
    print(f"wrote {len(stats)} images (+{len(BAD)} bad files) in {args.classes} classes to {args.out}")
    print(distribution(stats))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
