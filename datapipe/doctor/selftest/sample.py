"""The records the self-test runs on when the user names none: a small image folder of synthetic
JPEGs, made in a temporary folder, with what the GPU decoders treat differently: baseline JPEGs
(the hardware decoder's), progressive ones (nvJPEG's CUDA path), 4:4:4 and 4:2:0 chroma, grayscale,
and sizes that are neither square nor even."""
from __future__ import annotations

from pathlib import Path

import numpy as np

CLASSES = 3


def smooth_texture(rng: np.random.Generator, width: int, height: int):
    """A smooth random image (low-frequency noise over a gradient): it survives resampling by either
    decoder's filter almost unchanged, as photographs do, so decode differences stay visible."""
    from PIL import Image

    coarse = Image.fromarray(rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)).resize((width, height), Image.BICUBIC)
    ramp = np.linspace(0, 60, width, dtype=np.float32)[None, :, None]
    pixels = np.clip(np.asarray(coarse, dtype=np.float32) * 0.75 + ramp, 0, 255).astype(np.uint8)
    return Image.fromarray(pixels)


def synthetic_folder(root: Path, *, images: int = 48, seed: int = 0) -> Path:
    """root/CLASS/NAME.jpg, `images` JPEGs over CLASSES classes; returns root."""
    if images < CLASSES:
        raise ValueError(f"images must be at least {CLASSES} (one per class), got {images}")
    rng = np.random.default_rng(seed)
    root = Path(root)
    for i in range(images):
        folder = root / f"class{i % CLASSES}"
        folder.mkdir(parents=True, exist_ok=True)
        width, height = (int(v) for v in rng.integers(97, 401, size=2))
        image = smooth_texture(rng, width, height)
        options: dict = {"quality": 90}
        if i % 6 == 5:
            options["progressive"] = True
        if i % 4 == 1:
            options["subsampling"] = 0  # 4:4:4
        if i % 8 == 7:
            image = image.convert("L")
        image.save(folder / f"img{i:03d}.jpg", **options)
    return root
