"""The fuzz targets: one check per parser of untrusted bytes, with its oracle and its seed corpus.

A check takes one input and returns quietly when the code under test behaved: it returned, or it
raised the error its module documents (ValueError and its subclasses, plus the few noted below).
Anything else escapes: another exception type, a `Finding` (a broken contract: a hang, memory past
the bound, a wrong result, a written canary), or, under AddressSanitizer, a crash report. The
atheris driver (fuzz/run.py) and the seeded mutation pass of `make test`
(tests/security/test_fuzz_smoke.py) share these checks, so what one finds the other replays.

Seeds come from fixtures/: the JPEGs there, and a small `.wds` dataset packed from them (its
shards, `.idx` files and manifest).
"""
from __future__ import annotations

import atexit
import io
import json
import math
import random
import shutil
import tempfile
import time
import tracemalloc
import warnings
from pathlib import Path
from types import ModuleType

import numpy as np

from fuzz import mix_state_target, parquet_target, shard_table_target, sidecars_target, size_schedule_target
from fuzz.contract import FIXTURES, ROOT, Finding, Target, timed  # noqa: F401 (ROOT: for fuzz/run.py, tests)

REGION_PIXELS = 1 << 22  # the region target decodes at most this many pixels per input


# --- seeds ------------------------------------------------------------------------------------

def fixture_jpegs() -> list[bytes]:
    """Every JPEG under fixtures/ (by content: the truncated, progressive, CMYK, EXIF ones too)."""
    files = sorted(p for p in FIXTURES.rglob("*") if p.is_file())
    return [d for d in (p.read_bytes() for p in files) if d.startswith(b"\xff\xd8")]


_DATASET: Path | None = None


def wds_dataset() -> Path:
    """A small `.wds` dataset packed from fixture JPEGs (3 shards, 2 splits, one skipped file), made
    once per process in a temporary folder."""
    global _DATASET
    if _DATASET is None:
        from datapipe.formats.wds import WdsWriter
        from datapipe.records import Manifest, Record, SplitInfo, record_digest

        folder = Path(tempfile.mkdtemp(prefix="datapipe-fuzz-"))
        atexit.register(shutil.rmtree, folder, True)
        jpegs = sorted(fixture_jpegs(), key=len)[:6]
        writer = WdsWriter(folder, size_hint=0, shard_bytes=2 * max(map(len, jpegs)))
        splits = {"train": SplitInfo(), "val": SplitInfo()}
        for i, data in enumerate(jpegs):
            split = "val" if i == 5 else "train"
            key = f"{split}_{i:04d}"
            record = Record(key, data, i % 2, f"c{i % 2}/{key}.jpg", record_digest(key, i % 2, data))
            writer.write(split, splits[split].samples, record)
            splits[split].add(record)
        writer.close(Manifest("wds", ["c0", "c1"], splits, {"seed": 0}, created="2000-01-01T00:00:00"))
        _DATASET = folder
    return _DATASET


def tar_seeds() -> list[bytes]:
    """The dataset's shards, plus tars from `tarfile` in the GNU and PAX formats (long names, a
    directory, a link) so the indexer's other branches have a start."""
    import tarfile  # here, not at the top: atheris instruments it only if it imports it first
    folder = wds_dataset()
    out = [p.read_bytes() for p in sorted(folder.glob("*.tar"))]
    for fmt in (tarfile.GNU_FORMAT, tarfile.PAX_FORMAT):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
            for name, payload in ((f"{'d' * 120}/s0.cls", b"1"), ("s0.jpg", fixture_jpegs()[0][:600]),
                                  ("s1.cls", b"0"), (".hidden", b"x")):
                info = tarfile.TarInfo(name)
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
            link = tarfile.TarInfo("s1.jpg")
            link.type, link.linkname = tarfile.SYMTYPE, "s0.jpg"
            tar.addfile(link)
        out.append(buf.getvalue())
    return out


def idx_seeds() -> list[bytes]:
    return [p.read_bytes() for p in sorted(wds_dataset().glob("*.idx"))]


def manifest_seeds() -> list[bytes]:
    """The dataset's manifest, and one that lists a skipped file (a gap in the record positions)."""
    text = (wds_dataset() / "manifest.json").read_text(encoding="utf-8")
    body = json.loads(text)
    body["splits"]["train"]["skipped"] = [{"path": "c0/bad.jpg", "error": "corrupt", "position": 1}]
    return [text.encode(), json.dumps(body).encode()]


def region_seeds() -> list[bytes]:
    """Fixture JPEGs behind a 5-byte parameter prefix (whole image, a centre crop at 1/2, a corner at 1/8)."""
    prefixes = (bytes([0, 0, 0, 255, 255]), bytes([1, 64, 64, 128, 128]), bytes([3, 200, 10, 40, 250]))
    return [p + d for d in fixture_jpegs() for p in prefixes]


# --- oracles ----------------------------------------------------------------------------------

def pillow_verdict(data: bytes, whole: bool = True) -> bool:
    """Whether Pillow decodes the stream at 1/8 scale, entropy data and all: handed it whole (the
    validation's decode, datapipe.image.decode._decode_for_validation, the verdict the skeleton must keep),
    or, whole=False, read 64 KiB at a time (as the validation did before: it could miss an error
    after the last scan)."""
    from PIL import Image

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            img = Image.open(io.BytesIO(data))
            if whole:
                img.decodermaxblock = max(img.decodermaxblock, len(data))
            img.draft(img.mode, (max(1, img.width // 8), max(1, img.height // 8)))
            img.load()
            return True
        except Exception:  # noqa: BLE001 - any failure is a rejection here
            return False


def check_jpeg_markers(data: bytes) -> None:
    """skeleton() never raises (its docstring: anything unclean gives None); what it returns starts
    with SOI, ends with EOI, is no longer than its input, and decodes (Pillow, 1/8 scale) exactly
    when the input does: the module's contract. The decode is compared for frames up to 2^24 pixels."""
    from datapipe.image.jpeg_markers import skeleton

    start = time.process_time()
    kept = skeleton(data)
    timed("skeleton", start)
    if kept is None:
        return
    if not (kept.startswith(b"\xff\xd8") and kept.endswith(b"\xff\xd9") and len(kept) <= len(data)):
        raise Finding(f"skeleton gave {len(kept)} bytes from {len(data)}: not SOI ... EOI within the input")
    import simplejpeg

    try:
        height, width, _, _ = simplejpeg.decode_jpeg_header(data)
    except ValueError:
        height = width = 1
    if width * height <= 1 << 24 and pillow_verdict(kept) != pillow_verdict(data):
        raise Finding(f"the skeleton decodes: {pillow_verdict(kept)}, the stream: {pillow_verdict(data)}")


REGION_EXT: ModuleType | None = None  # the driver puts the AddressSanitizer build here


def _region_ext() -> ModuleType:
    global REGION_EXT
    if REGION_EXT is None:
        from datapipe import _jpeg_region

        REGION_EXT = _jpeg_region
    return REGION_EXT


def jpeg_size(jpeg: bytes) -> tuple[int, int] | None:
    """(height, width) from the header, as datapipe.augment.view reads it before the region decode."""
    import simplejpeg

    try:
        height, width, _, _ = simplejpeg.decode_jpeg_header(jpeg)
    except ValueError:
        return None
    return height, width


def region_args(params: bytes, jpeg: bytes) -> tuple[int, int, int, int, int]:
    """(scale_denom, left, top, width, height) from 5 parameter bytes: a region inside the scaled
    image by the header's size, or (bit 2 of the first byte) raw values that may fall outside it."""
    p = params.ljust(5, b"\0")
    denom = (1, 2, 4, 8)[p[0] & 3]
    if p[0] & 4:
        return denom, p[1] * 8, p[2] * 8, p[3] * 8 + 1, p[4] * 8 + 1
    height, width = jpeg_size(jpeg) or (64, 64)
    sw, sh = max(1, math.ceil(width / denom)), max(1, math.ceil(height / denom))
    left, top = p[1] * sw // 256, p[2] * sh // 256
    w, h = max(1, (p[3] + 1) * (sw - left) // 256), max(1, (p[4] + 1) * (sh - top) // 256)
    while w * h > REGION_PIXELS:
        w, h = max(1, w // 2), max(1, h // 2)
    return denom, left, top, w, h


_CANARY = np.frombuffer(bytes(range(256)) * 16, np.uint8)


def check_jpeg_region(data: bytes) -> None:
    """decode_region (5 parameter bytes, then the JPEG) returns None or raises ValueError, writes
    nothing past region_buffer_size(width, height) bytes (a canary follows them), and finishes in
    time. Under the AddressSanitizer build, a memory error aborts with a report. Frames over Pillow's
    MAX_IMAGE_PIXELS are skipped, as its caller skips them (a progressive one would make libjpeg
    hold every coefficient of the frame: a 3 KB file saying 30000 x 30000 takes 2.6 GB)."""
    from PIL import Image

    size = jpeg_size(data[5:])
    if size and size[0] * size[1] > Image.MAX_IMAGE_PIXELS:
        return  # the caller's precondition (layout.jpeg_layout): libjpeg's memory grows with the frame
    ext = _region_ext()
    denom, left, top, width, height = region_args(data[:5], data[5:])
    size = ext.region_buffer_size(width, height)
    buf = np.empty(size + len(_CANARY), np.uint8)
    buf[size:] = _CANARY
    start = time.process_time()
    try:
        ext.decode_region(data[5:], denom, left, top, width, height, buf[:size])
    except ValueError:
        pass
    timed("decode_region", start)
    if not np.array_equal(buf[size:], _CANARY):
        first = int(np.argmax(buf[size:] != _CANARY))
        raise Finding(f"decode_region{(denom, left, top, width, height)} wrote {first}+ bytes past its buffer")


def _tar_file() -> Path:
    global _TAR_FILE
    if _TAR_FILE is None:
        folder = Path(tempfile.mkdtemp(prefix="datapipe-fuzz-tar-"))
        atexit.register(shutil.rmtree, folder, True)
        _TAR_FILE = folder / "input.tar"
    return _TAR_FILE


_TAR_FILE: Path | None = None


def check_tar(data: bytes) -> None:
    """members() on a sample's span and scan_tar() on a shard: ValueError or a result, in time."""
    from datapipe.formats.tar import members, scan_tar

    start = time.process_time()
    try:
        members(data, "fuzz")
    except ValueError:
        pass
    path = _tar_file()
    path.write_bytes(data)
    try:
        scan_tar(str(path))
    except ValueError:
        pass
    timed("tar", start)


def check_idx(data: bytes) -> None:
    """parse_idx() and sample_starts() on a shard's `.idx` (read as ASCII, as its readers do):
    ValueError (UnicodeDecodeError is one) or a result, in time."""
    from datapipe.formats.tar import parse_idx
    from datapipe.formats.wds_index import sample_starts

    start = time.process_time()
    for parse in (parse_idx, sample_starts):
        try:
            parse(data.decode("ascii"))
        except ValueError:
            pass
    timed("idx", start)


def check_manifest(data: bytes) -> None:
    """A `.wds` manifest (read as UTF-8, as read_dir_manifest does) over the fixture dataset:
    Manifest.from_json, then WdsDataset on each of its first two splits and its first three records.
    ValueError (the documented error: damaged dataset, unknown split) or OSError (a file it names
    is missing) or a result, in time and within the memory bound."""
    from datapipe.formats.wds import WdsDataset
    from datapipe.records import Manifest

    start = time.process_time()
    try:
        manifest = Manifest.from_json(data.decode("utf-8"), source="fuzz manifest")
    except ValueError:
        return
    if manifest.format != "wds":
        return
    root = wds_dataset()
    for split in list(manifest.splits)[:2]:
        try:
            ds = WdsDataset(root, manifest, split)
            for i in range(min(len(ds), 3)):
                ds.record(i)
        except (ValueError, OSError):
            pass
    timed("manifest", start)


def _region_guide(data: bytes) -> object:
    """The C decoder has no coverage instrumentation (gcc, see fuzz/README.md): the marker walk of
    the same bytes tells the fuzzer when an input has a new segment structure."""
    from datapipe.image.jpeg_markers import skeleton

    return skeleton(data[5:])


TARGETS: dict[str, Target] = {t.name: t for t in (
    Target("jpeg_markers", check_jpeg_markers, fixture_jpegs, ("datapipe.image.jpeg_markers",)),
    Target("jpeg_region", check_jpeg_region, region_seeds, ("datapipe.image.jpeg_markers",), guide=_region_guide),
    Target("tar", check_tar, tar_seeds, ("datapipe.formats.tar", "tarfile"), memory=(4, 1 << 20)),
    Target("idx", check_idx, idx_seeds, ("datapipe.formats.tar", "datapipe.formats.wds"), memory=(64, 1 << 20)),
    Target("manifest", check_manifest, manifest_seeds, ("datapipe.records", "datapipe.formats.wds",
                                                        "datapipe.formats.tar", "json"), memory=(64, 4 << 20)),
    parquet_target.TARGET, sidecars_target.TARGET, shard_table_target.TARGET, mix_state_target.TARGET,
    size_schedule_target.TARGET,
)}


def run_checked(target: Target, data: bytes) -> None:
    """target.check(data), and with a memory bound the tracemalloc peak against it (tracing must be on)."""
    if target.memory is None or not tracemalloc.is_tracing():
        target.check(data)
        return
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    target.check(data)
    peak = tracemalloc.get_traced_memory()[1] - base
    per_byte, constant = target.memory
    if peak > per_byte * len(data) + constant:
        raise Finding(f"{target.name}: {peak} bytes allocated for a {len(data)}-byte input "
                      f"(bound {per_byte} x input + {constant})")


# --- the plain mutator (the seeded pass of `make test`, and the AddressSanitizer phase) -----------

_MARKERS = (0xD8, 0xD9, 0xDA, 0xDB, 0xC4, 0xC0, 0xC2, 0xDD, 0xE1, 0xFE, 0x01, 0xD0)


def mutate(data: bytes, others: list[bytes], rng: random.Random, keep: int = 0) -> bytes:
    """1-6 edits of the kinds damage and attackers make: bit flips, overwritten bytes (0x00, 0xFF,
    digits), cuts, lost runs, inserted bytes or JPEG markers, a splice with another seed. The first
    `keep` bytes (a target's parameters) are redrawn at random instead, now and then."""
    head, body = bytearray(data[:keep]), bytearray(data[keep:])
    if keep and rng.random() < 0.3:
        head = bytearray(rng.randbytes(keep))
    for _ in range(rng.randint(1, 6)):
        at, op = rng.randrange(len(body) + 1), rng.random()
        if op < 0.3 and body:
            body[min(at, len(body) - 1)] ^= 1 << rng.randrange(8)
        elif op < 0.45 and body:
            body[min(at, len(body) - 1)] = rng.choice([0x00, 0xFF, 0x7F, 0x80, rng.randrange(0x30, 0x3A), rng.randrange(256)])
        elif op < 0.55:
            del body[at:]
        elif op < 0.65:
            del body[at:at + rng.randint(1, 64)]
        elif op < 0.75:
            body[at:at] = rng.randbytes(rng.randint(1, 16))
        elif op < 0.87:
            body[at:at] = bytes([0xFF, rng.choice(_MARKERS)]) + rng.randbytes(rng.choice([0, 2]))
        else:
            other = rng.choice(others)[keep:]
            cut = rng.randrange(len(other) + 1)
            body = body[:at] + other[cut:cut + rng.randint(1, 4096)] + body[at:]
    return bytes(head + body)


PARAM_BYTES = {"jpeg_region": 5}  # a target's input prefix that is parameters, not data
