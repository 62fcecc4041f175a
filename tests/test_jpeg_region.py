"""The region JPEG decoder: the pixels of a whole-image decode cut to the region, and clean errors."""
import io
import math
import random
from pathlib import Path

import numpy as np
import pytest
import simplejpeg
import torch
from PIL import Image

from datapipe.augment import view as transforms
from tests.conftest import IMAGEFOLDER

HEADERS = [Path(p) / "jpeglib.h" for p in ("/usr/include", "/usr/local/include")]
needs_region = pytest.mark.skipif(
    not transforms.region_decoder_available(),
    reason="datapipe._jpeg_region is not in use (not built without libjpeg headers, or failed its probe)")


def test_region_decoder_is_in_use_where_libjpeg_headers_exist():
    if not any(h.exists() for h in HEADERS):
        pytest.skip("no jpeglib.h on this machine: setup.py skips the optional extension")
    assert transforms.region_decoder_available(), \
        "jpeglib.h exists but datapipe._jpeg_region did not build or failed its probe"


def encode(size=(333, 251), seed=0, **save) -> bytes:
    """A JPEG of smooth gradients plus noise: chroma varies, so upsampling errors would show."""
    w, h = size
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    rgb = np.stack([x * 255 // w, y * 255 // h, (x + y) * 255 // (w + h)], -1) + rng.integers(0, 60, (h, w, 3))
    img = Image.fromarray(rgb.clip(0, 255).astype(np.uint8))
    if save.pop("gray", False):
        img = img.convert("L")
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=90, **save)
    return buf.getvalue()


JPEGS = {
    "420": encode(subsampling=2),
    "422": encode(subsampling=1, seed=1),
    "444": encode(subsampling=0, seed=2),
    "gray": encode(gray=True, seed=3),
    "progressive": encode(progressive=True, seed=4),
    "restart": encode(seed=5, restart_marker_blocks=3),
    "tiny": encode(size=(9, 7), seed=6),
    "fixture": (IMAGEFOLDER / "train" / "cat" / "cat_000.jpg").read_bytes(),
}


def encode_cmyk(size=(203, 151), seed=7, orientation=1) -> bytes:
    """A CMYK JPEG (Pillow writes Adobe's inverted CMYK) whose K varies, so Pillow's CMYK -> RGB
    rule shows; with an EXIF orientation when asked."""
    w, h = size
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    cmyk = np.stack([x * 255 // w, y * 255 // h, (x + y) * 255 // (w + h), (w - x) * 200 // w], -1)
    cmyk = (cmyk + rng.integers(0, 50, (h, w, 4))).clip(0, 255).astype(np.uint8)
    exif = Image.Exif()
    exif[0x0112] = orientation
    buf = io.BytesIO()
    Image.fromarray(cmyk, "CMYK").save(buf, "JPEG", quality=90, exif=exif.tobytes())
    return buf.getvalue()


CMYK_JPEGS = {
    "cmyk": encode_cmyk(),
    "cmyk-rotated": encode_cmyk(size=(150, 97), seed=8, orientation=6),
    "cmyk-fixture": (IMAGEFOLDER / "train" / "cat" / "cmyk.jpg").read_bytes(),
}


def whole(data: bytes, factor: int) -> np.ndarray:
    h, w, _, _ = simplejpeg.decode_jpeg_header(data)
    shrink = dict(min_width=math.ceil(w / factor), min_height=math.ceil(h / factor)) if factor > 1 else {}
    return simplejpeg.decode_jpeg(data, colorspace="RGB", **shrink)


def region(data: bytes, factor: int, left: int, top: int, width: int, height: int) -> np.ndarray:
    out = np.empty(transforms._jpeg_region.region_buffer_size(width, height), np.uint8)
    transforms._jpeg_region.decode_region(data, factor, left, top, width, height, out)
    return out[:width * height * 3].reshape(height, width, 3)


def regions(width: int, height: int, rng: random.Random):
    """Corners, edges, single pixels, the whole image, and random boxes."""
    yield 0, 0, width, height
    yield 0, 0, 1, 1
    yield width - 1, height - 1, 1, 1
    yield 0, height // 2, width, height - height // 2
    yield width // 2, 0, width - width // 2, height
    for _ in range(12):
        w, h = rng.randint(1, width), rng.randint(1, height)
        yield rng.randint(0, width - w), rng.randint(0, height - h), w, h


def every_region_equals(data: bytes, full: np.ndarray, factor: int, seed: str) -> None:
    """decode_region of each of `regions` equals that region of `full` (a whole decode at 1/factor)."""
    for left, top, w, h in regions(full.shape[1], full.shape[0], random.Random(seed)):
        got = region(data, factor, left, top, w, h)
        want = full[top:top + h, left:left + w]
        assert np.array_equal(got, want), f"{seed}: 1/{factor} region {(left, top, w, h)}: " \
                                          f"max diff {np.abs(got.astype(int) - want).max()}"


@needs_region
@pytest.mark.parametrize("name", sorted(JPEGS))
@pytest.mark.parametrize("factor", [1, 2, 4, 8])
def test_region_equals_the_whole_decode_cut_to_it(name, factor):
    data = JPEGS[name]
    full = whole(data, factor)
    every_region_equals(data, full, factor, f"{name}{factor}")


@needs_region
@pytest.mark.parametrize("name", sorted(CMYK_JPEGS))
@pytest.mark.parametrize("factor", [1, 2, 4, 8])
def test_a_cmyk_region_equals_pillows_rgb_cut_to_it(name, factor):
    """Pillow's pixels (its libjpeg, its Adobe inversion, its CMYK -> RGB) at the same DCT scale."""
    data = CMYK_JPEGS[name]
    img = Image.open(io.BytesIO(data))
    assert img.mode == "CMYK"
    width, height = img.size
    img.draft("CMYK", (max(1, width // factor), max(1, height // factor)))
    full = np.asarray(img.convert("RGB"))
    assert full.shape[:2] == (math.ceil(height / factor), math.ceil(width / factor))
    every_region_equals(data, full, factor, f"{name}{factor}")


@needs_region
@pytest.mark.parametrize("data, args, message", [
    (b"\xff\xd8\xff\xd9", (1, 0, 0, 1, 1), "no image"),
    (JPEGS["420"], (1, 300, 0, 40, 10), "outside the scaled image"),
    (JPEGS["420"], (8, 0, 0, 43, 32), "outside the scaled image"),  # 1/8 of 333 x 251 is 42 x 32
    (JPEGS["420"], (3, 0, 0, 10, 10), "scale_denom"),
    (JPEGS["420"], (1, -1, 0, 10, 10), "left, top >= 0"),
    (JPEGS["420"], (1, 2**31 - 5, 0, 10, 1), "outside the scaled image"),  # left + width overflows an int
    (JPEGS["420"], (1, 0, 0, 2**31 - 20, 1), "region_buffer_size"),  # so would width + margin
    (b"not a jpeg at all", (1, 0, 0, 1, 1), "Not a JPEG file"),
])
def test_bad_input_raises_value_error(data, args, message):
    out = np.empty(transforms._jpeg_region.region_buffer_size(min(max(args[3], 1), 400), max(args[4], 1)), np.uint8)
    with pytest.raises(ValueError, match=message):
        transforms._jpeg_region.decode_region(data, *args, out)


@needs_region
def test_too_small_a_buffer_is_refused_not_overrun():
    out = np.empty(10 * 10 * 3, np.uint8)  # room for the pixels, not for the margin
    with pytest.raises(ValueError, match="region_buffer_size"):
        transforms._jpeg_region.decode_region(JPEGS["420"], 1, 0, 0, 10, 10, out)


@pytest.fixture
def region_on():
    previous = transforms.set_region_decoding(True)  # whatever DATAPIPE_REGION_DECODE says
    yield
    transforms.set_region_decoding(previous)


@pytest.fixture
def region_off():
    previous = transforms.set_region_decoding(False)
    yield
    transforms.set_region_decoding(previous)


def train_views(data: bytes, size: int) -> list[torch.Tensor]:
    return [transforms.plan_and_decode(data, None, seed, 0, 0, size, train=True)[0] for seed in range(20)]


@needs_region
@pytest.mark.parametrize("name", sorted(JPEGS) + sorted(CMYK_JPEGS))
@pytest.mark.parametrize("size", [224, 32])  # 224: mostly full scale; 32: DCT-scaled crops
def test_train_view_is_the_same_with_and_without_the_region_decoder(name, size, request, region_on):
    data = {**JPEGS, **CMYK_JPEGS}[name]
    assert transforms.region_decoding(data)
    with_region = train_views(data, size)
    request.getfixturevalue("region_off")
    assert not transforms.region_decoding(data)
    for seed, (a, b) in enumerate(zip(with_region, train_views(data, size))):
        assert torch.equal(a, b), f"{name} seed {seed}"


@pytest.mark.parametrize("cut", [0.5, 0.9])
def test_truncated_jpeg_fails_even_when_the_crop_misses_the_lost_rows(cut, region_on):
    data = JPEGS["420"][:int(len(JPEGS["420"]) * cut)]
    assert not transforms.region_decoding(data)  # no EOI: the whole-image decode reports it
    for seed in range(10):
        with pytest.raises(ValueError, match="Premature end"):
            transforms.plan_and_decode(data, None, seed, 0, 0, 32, train=True)[0]


@needs_region
def test_mutated_streams_raise_value_error_or_decode_never_crash():
    """Byte flips, cuts and insertions into real JPEGs: the C code must fail cleanly. (A timed version
    of this loop ran 150k cases, and 16k under valgrind memcheck, with no error in our code.)"""
    rng = random.Random(0)
    out = np.empty(transforms._jpeg_region.region_buffer_size(400, 300), np.uint8)
    seeds, outcomes = list(JPEGS.values()), {"decoded": 0, "refused": 0}
    for _ in range(3000):
        data = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(1, 8)):
            at, op = rng.randrange(len(data)), rng.random()
            if op < 0.6:
                data[at] = rng.randrange(256)
            elif op < 0.8:
                del data[at:at + rng.randint(1, 64)]
            else:
                data[at:at] = rng.randbytes(rng.randint(1, 16))
        try:
            transforms._jpeg_region.decode_region(bytes(data), rng.choice([1, 2, 4, 8]), rng.randint(0, 300),
                                                  rng.randint(0, 200), rng.randint(1, 400), rng.randint(1, 300), out)
            outcomes["decoded"] += 1
        except ValueError:
            outcomes["refused"] += 1
    assert outcomes["decoded"] > 10 and outcomes["refused"] > 1000, outcomes


def corrupt_but_complete(count: int) -> list[bytes]:
    """JPEGs with one flipped bit in their entropy data: complete streams that libjpeg decodes past
    with a warning (a quarter of them end with 'extraneous bytes before marker 0xd9')."""
    rng, base = random.Random(0), JPEGS["420"]
    first = base.index(b"\xff\xda") + 20  # past the start-of-scan header
    out = []
    for _ in range(count):
        data = bytearray(base)
        data[rng.randrange(first, len(base) - 2)] ^= 1 << rng.randrange(8)
        out.append(bytes(data))
    return out


@pytest.mark.parametrize("region", [True, False])
def test_every_record_the_converter_accepts_decodes_in_every_view(region):
    """Pillow (the converter's validator) accepts corrupt entropy data; so must every view, whatever
    the crop, or a record would be skipped in some epochs and not in others."""
    from datapipe.image.decode import check_image
    from datapipe.image.headers import BadImageError

    previous, accepted = transforms.set_region_decoding(region), 0
    try:
        for data in corrupt_but_complete(60):
            try:
                check_image(data)
            except BadImageError:
                continue  # rejected at conversion: never in a packed dataset
            accepted += 1
            for seed in range(4):
                transforms.plan_and_decode(data, None, seed, 0, 0, 64, train=True)[0]
            transforms.plan_and_decode(data, None, 0, 0, 0, 64, train=False)[0]
    finally:
        transforms.set_region_decoding(previous)
    assert accepted >= 40


@needs_region
def test_corrupt_entropy_data_decodes_to_the_same_pixels_either_way(region_on):
    for k, data in enumerate(corrupt_but_complete(30)):
        with_region = train_views(data, 64)
        transforms.set_region_decoding(False)
        whole = train_views(data, 64)
        transforms.set_region_decoding(True)
        assert all(torch.equal(a, b) for a, b in zip(with_region, whole)), f"corrupt file {k}"


class StandIn:
    """A decoder module as a wrong libjpeg at run time would make it behave."""

    region_buffer_size = staticmethod(lambda w, h: (w + 96) * h * 3)

    def __init__(self, error: str = "") -> None:
        self.error = error

    def decode_region(self, data, denom, left, top, width, height, out):
        if self.error:
            raise ValueError(self.error)
        out[:] = 128  # decodes "successfully" to the wrong pixels


@needs_region
def test_probe_accepts_the_built_decoder_and_refuses_a_wrong_one():
    from datapipe.image import jpeg_region

    assert jpeg_region.probe(transforms._jpeg_region) == ""
    assert "differ" in jpeg_region.probe(StandIn())
    mismatch = "Wrong JPEG library version: library is 80, caller expects 62"
    assert jpeg_region.probe(StandIn(mismatch)) == mismatch


@needs_region
def test_a_decoder_failing_its_probe_is_switched_off_with_a_warning(monkeypatch, caplog):
    from datapipe.image import jpeg_region

    assert jpeg_region.load() is transforms._jpeg_region
    monkeypatch.setattr(jpeg_region, "probe", lambda ext: "its pixels differ from simplejpeg's")
    assert jpeg_region.load() is None
    assert "switched off (its pixels differ" in caplog.text
