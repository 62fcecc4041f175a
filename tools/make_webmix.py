"""Build a web-scrape-like ImageNet-layout folder for the peer comparison (tools/compare_peers.py).

    python tools/make_webmix.py --out build/webmix [--images 3000] [--overwrite]

Photo-like synthetic pictures (tools/make_sample.py's crops of the fixture photos with texture and
noise) in the mix a scraped dataset has: ImageNet-like sizes (shorter side 240-640 px, a few 1600 px
ones), aspect ratios 3:4 to 16:9, JPEG quality 70-95, some 4:4:4 and progressive JPEGs, grayscale,
and about 15% awkward files (CMYK JPEGs, palette and RGBA PNGs, EXIF-rotated JPEGs) that the one RGB
rule must convert. The fixture's four bad files (truncated, empty, text named .jpg, decompression
bomb) are copied in, so every converter meets them. No network is needed (real photos are not
reachable from this machine).
"""
from __future__ import annotations

import argparse
import io
import shutil
import sys
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tools.make_sample import FIXTURES, base_pictures, clear_output, sample_image  # noqa: E402

BAD = ("cat/truncated.jpg", "dog/empty.jpg", "dog/text.jpg", "fish/bomb.png")
ASPECTS = (4 / 3, 3 / 4, 1.0, 3 / 2, 16 / 9, 2 / 3)
# kind -> share of the images; "jpeg" takes the rest
KINDS = {"cmyk": 0.05, "palette": 0.04, "exif": 0.05, "rgba": 0.01, "gray": 0.02, "png": 0.03}


def picture_size(rng: np.random.Generator) -> tuple[int, int]:
    short = 1600 if rng.random() < 0.03 else int(rng.integers(240, 641))
    aspect = ASPECTS[int(rng.integers(len(ASPECTS)))]
    return (round(short * aspect), short) if aspect >= 1 else (short, round(short / aspect))


def encode(img: Image.Image, kind: str, rng: np.random.Generator) -> tuple[bytes, str]:
    """The file bytes and extension of one picture of `kind`."""
    out = io.BytesIO()
    quality = int(rng.integers(70, 96))
    if kind == "cmyk":
        img.convert("CMYK").save(out, "JPEG", quality=quality)
    elif kind == "palette":
        img.quantize(256).save(out, "PNG")
    elif kind == "rgba":
        rgba = img.convert("RGBA")
        rgba.putalpha(Image.linear_gradient("L").resize(img.size))
        rgba.save(out, "PNG")
        return out.getvalue(), "png"
    elif kind == "png":
        img.save(out, "PNG", compress_level=6)
        return out.getvalue(), "png"
    elif kind == "exif":
        exif = Image.Exif()
        exif[0x0112] = int(rng.choice([3, 6, 8]))
        img.save(out, "JPEG", quality=quality, exif=exif.tobytes())
    else:
        pixels = img.convert("L") if kind == "gray" else img
        pixels.save(out, "JPEG", quality=quality, progressive=bool(rng.random() < 0.15),
                    subsampling=0 if rng.random() < 0.2 else 2)
    return out.getvalue(), ("png" if kind == "palette" else "jpg")


def pick_kind(rng: np.random.Generator) -> str:
    roll, edge = rng.random(), 0.0
    for kind, share in KINDS.items():
        edge += share
        if roll < edge:
            return kind
    return "jpeg"


def make(out: Path, images: int, seed: int) -> int:
    rng = np.random.default_rng(seed)
    classes = sorted(p.name for p in (FIXTURES / "train").iterdir() if p.is_dir())
    bases = {c: base_pictures(FIXTURES / "train" / c, (400, 300)) for c in classes}
    for i in range(images):
        cls = classes[i % len(classes)]
        size = picture_size(rng)
        img = sample_image(bases[cls][int(rng.integers(len(bases[cls])))], rng, size)
        data, ext = encode(img, pick_kind(rng), rng)
        folder = out / "train" / cls
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{cls}_{i:06d}.{ext}").write_bytes(data)
    for bad in BAD:
        shutil.copy(FIXTURES / "train" / bad, out / "train" / bad)
    return images


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--images", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out folder")
    args = parser.parse_args()
    if not clear_output(args.out, args.overwrite):
        return 2
    n = make(args.out, args.images, args.seed)
    print(f"wrote {n} images (+{len(BAD)} bad files) to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
