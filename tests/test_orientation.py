"""Awkward images kept as their original bytes decode by the one RGB rule: EXIF orientation applied
to the decoded (cropped) pixels, CMYK converted as Pillow does, at any DCT scale."""
import io

import numpy as np
import pytest
import torch
from PIL import Image, ImageFilter, ImageOps

from datapipe.augment import view as transforms
from datapipe.image.decode import to_rgb
from datapipe.image.orientation import orient, stored_box, upright_size
from tests.test_jpeg_region import needs_region


def with_orientation(img: Image.Image, orientation: int) -> Image.Image:
    img.getexif()[0x0112] = orientation
    return img


@pytest.mark.parametrize("orientation", range(1, 9))
def test_orient_is_pils_exif_transpose_and_stored_box_maps_every_box(orientation):
    rng = np.random.default_rng(orientation)
    stored = rng.integers(0, 256, (5, 7, 3), dtype=np.uint8)
    want = np.asarray(ImageOps.exif_transpose(with_orientation(Image.fromarray(stored), orientation)))
    upright = orient(stored, orientation)
    assert np.array_equal(upright, want)
    assert upright.shape[1::-1] == upright_size(7, 5, orientation)
    h, w = upright.shape[:2]
    for left in range(w):
        for right in range(left + 1, w + 1):
            for top, bottom in ((0, h), (1, 3), (h - 1, h)):
                sl, st, sr, sb = stored_box((left, top, right, bottom), orientation, 7, 5)
                assert np.array_equal(orient(stored[st:sb, sl:sr], orientation), upright[top:bottom, left:right])


def textured(size=(300, 200), seed=0) -> Image.Image:
    rng = np.random.default_rng(seed)
    noise = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    return Image.fromarray(noise).filter(ImageFilter.GaussianBlur(2))


def encoded(img: Image.Image, fmt: str, **save) -> bytes:
    out = io.BytesIO()
    img.save(out, fmt, **save)
    return out.getvalue()


def rotated_jpeg(orientation: int, size=(300, 200)) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return encoded(textured(size, orientation), "JPEG", quality=92, exif=exif.tobytes())


def png_of_the_rule(data: bytes) -> bytes:
    return encoded(to_rgb(Image.open(io.BytesIO(data))), "PNG")


def views(data: bytes, size: int, train: bool) -> list[torch.Tensor]:
    return [transforms.plan_and_decode(data, None, seed, 0, 0, size, train=train)[0] for seed in range(12)]


@pytest.mark.parametrize("orientation", range(1, 9))
@pytest.mark.parametrize("train", [True, False])
def test_a_rotated_jpeg_decodes_to_the_pixels_of_its_png(orientation, train):
    """At full DCT scale (224 px views of a 300x200 image) the original JPEG, whose orientation is
    applied after decoding (its crop alone, on the train path), gives exactly the pixels of the RGB
    PNG the converter used to store."""
    data = rotated_jpeg(orientation)
    for seed, (a, b) in enumerate(zip(views(data, 224, train), views(png_of_the_rule(data), 224, train))):
        assert torch.equal(a, b), f"orientation {orientation} seed {seed}"


@needs_region
@pytest.mark.parametrize("orientation", [3, 6, 7, 8])
def test_a_rotated_jpeg_crop_is_the_same_with_and_without_the_region_decoder(orientation):
    """32 px views: DCT-scaled crops, mapped back to the stored image and turned upright."""
    data = rotated_jpeg(orientation, size=(333, 251))
    previous = transforms.set_region_decoding(True)
    try:
        with_region = views(data, 32, True)
        transforms.set_region_decoding(False)
        whole = views(data, 32, True)
    finally:
        transforms.set_region_decoding(previous)
    for seed, (a, b) in enumerate(zip(with_region, whole)):
        assert torch.equal(a, b), f"orientation {orientation} seed {seed}"


def test_a_cmyk_jpeg_decodes_to_the_pixels_of_its_png():
    data = encoded(textured().convert("CMYK"), "JPEG", quality=92)
    for train in (True, False):
        for seed, (a, b) in enumerate(zip(views(data, 224, train), views(png_of_the_rule(data), 224, train))):
            assert torch.equal(a, b), f"train={train} seed {seed}"


def test_a_cmyk_jpeg_decodes_at_dct_scale_near_its_full_decode():
    """32 px views of a CMYK JPEG decode at 1/2-1/8 scale, as plain JPEGs do: close to, not equal to,
    the full-scale view (the control: a mirrored view is far)."""
    data = encoded(textured((640, 480)).convert("CMYK"), "JPEG", quality=92)
    png = png_of_the_rule(data)
    for a, b in zip(views(data, 32, False), views(png, 32, False)):
        diff = (a.float() - b.float()).abs().mean().item()
        assert diff < 3 and diff < (a.float() - b.flip(-1).float()).abs().mean().item() / 3
