"""Regenerate fixtures/imagefolder: a tiny real ImageNet-layout folder with the awkward and bad cases.

    python tools/make_fixtures.py            # rewrites fixtures/imagefolder and fixtures/extra_fish

Good images: RGB JPEGs, grayscale (.JPEG, upper case), CMYK JPEG, progressive JPEG, EXIF-rotated
JPEG, RGBA / palette / palette+transparency / 16-bit PNGs, a PNG named .JPEG, a nested folder and a
symlinked folder. Bad ones: truncated JPEG, zero bytes, text named .jpg, a decompression bomb.
The val split lacks the class `fish`. A .txt file is there to be ignored.
"""
from __future__ import annotations

import argparse
import io
import os
import shutil
from pathlib import Path

import numpy as np
from PIL import Image

COLORS = {"cat": (200, 80, 40), "dog": (40, 160, 90), "fish": (50, 90, 210)}


def picture(cls: str, seed: int, size: tuple[int, int] = (96, 72)) -> Image.Image:
    """A smooth, class-coloured picture with a seeded shape: natural enough to compress like a photo."""
    rng = np.random.default_rng(seed)
    w, h = size
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    base = np.array(COLORS[cls], dtype=np.float32)
    ramp = (x / w)[..., None] * rng.uniform(-80, 80, 3) + (y / h)[..., None] * rng.uniform(-80, 80, 3)
    cx, cy, r = rng.uniform(0.2, 0.8) * w, rng.uniform(0.2, 0.8) * h, rng.uniform(0.1, 0.3) * min(w, h)
    disc = (((x - cx) ** 2 + (y - cy) ** 2) < r * r)[..., None] * rng.uniform(-90, 90, 3)
    noise = rng.normal(0, 6, (h, w, 3))
    return Image.fromarray(np.clip(base + ramp + disc + noise, 0, 255).astype(np.uint8), "RGB")


def save(img: Image.Image, path: Path, fmt: str, **params) -> bytes:
    out = io.BytesIO()
    img.save(out, fmt, **params)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(out.getvalue())
    return out.getvalue()


def make(root: Path) -> None:
    folder, extra = root / "imagefolder", root / "extra_fish"
    for p in (folder, extra):
        shutil.rmtree(p, ignore_errors=True)
    seed = 0
    for split, count in (("train", 5), ("val", 2)):
        for cls in (("cat", "dog", "fish") if split == "train" else ("cat", "dog")):
            for i in range(count):
                seed += 1
                save(picture(cls, seed), folder / split / cls / f"{cls}_{i:03d}.jpg", "JPEG", quality=90)
    train = folder / "train"
    save(picture("cat", 101).convert("L"), train / "cat" / "gray.JPEG", "JPEG", quality=90)
    save(picture("cat", 102).convert("CMYK"), train / "cat" / "cmyk.jpg", "JPEG", quality=90)
    save(picture("cat", 103, (120, 80)), train / "cat" / "progressive.jpg", "JPEG", quality=90, progressive=True)
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise when displayed
    save(picture("cat", 104, (80, 60)), train / "cat" / "exif_rotated.jpg", "JPEG", quality=90, exif=exif)
    save(picture("cat", 105), train / "cat" / "nested" / "deeper" / "nested_000.jpg", "JPEG", quality=90)
    (train / "cat" / "notes.txt").write_text("not an image; the scan ignores it\n")
    good = save(picture("cat", 106), train / "cat" / "truncated.jpg", "JPEG", quality=90)
    (train / "cat" / "truncated.jpg").write_bytes(good[: len(good) * 2 // 3])

    rgba = picture("dog", 201).convert("RGBA")
    rgba.putalpha(Image.linear_gradient("L").resize(rgba.size))
    save(rgba, train / "dog" / "rgba.png", "PNG")
    save(picture("dog", 202).convert("P", palette=Image.Palette.ADAPTIVE, colors=32), train / "dog" / "palette.png", "PNG")
    wide = (np.asarray(picture("dog", 203).convert("L"), dtype=np.uint16) * 257).astype(np.uint16)
    save(Image.fromarray(wide), train / "dog" / "gray16.png", "PNG")
    save(picture("dog", 204), train / "dog" / "png_as_jpeg.JPEG", "PNG")
    (train / "dog" / "empty.jpg").write_bytes(b"")
    (train / "dog" / "text.jpg").write_text("this is not a JPEG\n")

    pal = picture("fish", 301).convert("P", palette=Image.Palette.ADAPTIVE, colors=16)
    save(pal, train / "fish" / "palette_alpha.png", "PNG", transparency=0)
    save(Image.new("1", (10_000, 10_000)), train / "fish" / "bomb.png", "PNG")
    for i in range(2):
        save(picture("fish", 310 + i), extra / f"linked_{i:03d}.jpg", "JPEG", quality=90)
    os.symlink(os.path.relpath(extra, train / "fish"), train / "fish" / "linked")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1] / "fixtures")
    make(parser.parse_args().root)
