"""The marker skeleton gives the validation verdict a decode of the whole stream gives, on thousands
of mutated JPEGs of every kind we store (baseline, progressive, restart intervals, grayscale, CMYK)."""
from __future__ import annotations

import io
import os
import random

import numpy as np
import pytest
from PIL import Image

from datapipe.image.decode import check_image
from datapipe.image.headers import BadImageError
from datapipe.image.jpeg_markers import skeleton
from fuzz.targets import pillow_verdict

MUTANTS = int(os.environ.get("DATAPIPE_JPEG_MUTANTS", "4000"))


def _photo(width: int, height: int, seed: int) -> Image.Image:
    """A smooth image with noise (like a photo: non-trivial DC and AC coefficients)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([(x * 255 // width), (y * 255 // height), ((x + y) * 127 // (width + height))], -1)
    return Image.fromarray((base + rng.integers(0, 40, base.shape)).clip(0, 255).astype(np.uint8))


def _save(img: Image.Image, quality: int = 90, **params) -> bytes:
    out = io.BytesIO()
    img.save(out, "JPEG", quality=quality, **params)
    return out.getvalue()


def _seeds() -> dict[str, bytes]:
    photo = _photo(96, 72, 0)
    exif = Image.Exif()
    exif[0x0112] = 6
    return {
        "baseline": _save(photo),
        "444": _save(photo, subsampling=0),
        "progressive": _save(photo, progressive=True),
        "restart-blocks": _save(photo, restart_marker_blocks=3),
        "progressive-restart": _save(photo, progressive=True, restart_marker_rows=1),
        "gray": _save(photo.convert("L"), progressive=True),
        "cmyk": _save(photo.convert("CMYK")),
        "exif-rotated": _save(photo, exif=exif.tobytes()),
    }


SEEDS = _seeds()


def shape_ok(data: bytes) -> bool:
    """Whether the stream's declared size is within MAX_ASPECT (unreadable headers count as within)."""
    from datapipe.image.geometry import MAX_ASPECT

    try:
        width, height = Image.open(io.BytesIO(data)).size
    except Exception:  # noqa: BLE001 - the decode verdict decides those
        return True
    return max(width, height) <= MAX_ASPECT * max(1, min(width, height))


def accepted(data: bytes) -> bool:
    try:
        check_image(data)
        return True
    except BadImageError:
        return False


def mutate(data: bytes, rng: random.Random) -> bytes:
    """1-6 random edits of the kinds real damage makes: flipped bits, overwritten bytes, lost and
    inserted runs, stray markers, a cut (with or without an end-of-image marker after it)."""
    data = bytearray(data)
    for _ in range(rng.randint(1, 6)):
        at, op = rng.randrange(len(data)), rng.random()
        if op < 0.35:
            data[at] ^= 1 << rng.randrange(8)
        elif op < 0.5:
            data[at] = rng.choice([0x00, 0xFF, rng.randrange(256)])
        elif op < 0.62:
            del data[at:at + rng.randint(1, 64)]
        elif op < 0.72:
            data[at:at] = rng.randbytes(rng.randint(1, 16))
        elif op < 0.87:
            data[at:at] = bytes([0xFF, rng.choice([0xD0 + rng.randrange(8), 0xD9, 0xDA, 0xC4, 0xDB, 0xDD,
                                                   0x01, 0xD8, 0xC0, 0xFE, rng.randrange(256)])])
        elif op < 0.95:
            del data[at:]
            if rng.random() < 0.5:
                data += b"\xff\xd9"
        else:  # a 0x00 stuffed after 0xFF becomes another byte: a marker inside the scan
            stuffed = [i for i in range(len(data) - 1) if data[i] == 0xFF and data[i + 1] == 0]
            if stuffed:
                data[rng.choice(stuffed) + 1] = rng.randrange(1, 256)
        if not data:
            break
    return bytes(data)


def test_the_skeleton_drops_the_entropy_data_and_keeps_progressive_dc_scans():
    for name, data in SEEDS.items():
        kept = skeleton(data)
        assert kept is not None and len(kept) < len(data), name
        assert pillow_verdict(kept), name
    grey = np.asarray(Image.open(io.BytesIO(skeleton(SEEDS["baseline"]))).convert("L"))
    assert (grey == 128).mean() > 0.9  # no coefficients left: libjpeg fills the scan with zeros
    original, reduced = (Image.open(io.BytesIO(d)) for d in (SEEDS["progressive"], skeleton(SEEDS["progressive"])))
    for img in (original, reduced):
        img.draft("RGB", (12, 9))
    a, b = (np.asarray(img, dtype=np.float64).ravel() for img in (original, reduced))
    assert np.corrcoef(a, b)[0, 1] > 0.95  # the DC image is still there


@pytest.mark.parametrize("data", [
    b"", b"\xff\xd8", b"\x89PNG\r\n\x1a\n",
    SEEDS["baseline"][:-2],  # no end-of-image marker
    SEEDS["baseline"][:len(SEEDS["baseline"]) // 2],  # cut inside the scan
    SEEDS["baseline"][:2] + b"\x00" + SEEDS["baseline"][2:],  # a byte between segments
    SEEDS["baseline"].replace(b"\xff\xc0", b"\xff\xc9", 1),  # arithmetic coding
])
def test_streams_that_are_not_clean_get_no_skeleton(data):
    assert skeleton(data) is None


@pytest.mark.filterwarnings("ignore::UserWarning")  # Pillow on mutated EXIF blocks
@pytest.mark.parametrize("name", sorted(SEEDS))
def test_verdict_matches_a_whole_decode_on_mutated_streams(name):
    rng = random.Random(name)
    outcomes = {"accepted": 0, "rejected": 0, "with skeleton": 0}
    for _ in range(MUTANTS // len(SEEDS)):
        data = mutate(SEEDS[name], rng)
        verdict = accepted(data)
        if not shape_ok(data):  # a mutated header past MAX_ASPECT: refused by the shape rule, by design
            assert not verdict, (name, data.hex())
            continue
        assert verdict == pillow_verdict(data), (name, data.hex())
        assert pillow_verdict(data, whole=False) or not verdict, (name, data.hex())  # never weaker than before
        outcomes["accepted" if verdict else "rejected"] += 1
        outcomes["with skeleton"] += skeleton(data) is not None
    total = MUTANTS // len(SEEDS)
    assert outcomes["accepted"] > total // 10 and outcomes["rejected"] > total // 10, outcomes
    assert outcomes["with skeleton"] > total // 4, outcomes  # the fast path is the one being tested


def test_an_error_after_the_last_scan_is_caught_wherever_reads_end():
    """A restart marker early in a single-scan JPEG ends its data there (the rest is skipped as
    garbage), and a stray SOS 90 KB on is an error. Reading 64 KiB at a time, Pillow stopped once the
    rows were out and never reached it; libjpeg-based loaders given the whole file fail on it."""
    photo = _save(_photo(900, 700, 1), quality=100)
    scan = photo.index(b"\xff\xda") + 20
    cut = [scan + 100, scan + 90_000]
    for i, at in enumerate(cut):
        while photo[at - 1] == 0xFF:
            at += 1
        cut[i] = at
    stray = photo[:cut[0]] + b"\xff\xd0" + photo[cut[0]:cut[1]] + b"\xff\xda" + photo[cut[1]:]
    assert pillow_verdict(stray, whole=False) and not pillow_verdict(stray)
    assert not accepted(stray)
