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
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Callable

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
CPU_SECONDS = 1.0  # a hang: more CPU time than this on one input (CPU, not wall: the cores are shared)
REGION_PIXELS = 1 << 22  # the region target decodes at most this many pixels per input


class Finding(AssertionError):
    """A broken contract that raised nothing: a hang, an allocation past the bound, a wrong answer."""


@dataclass(frozen=True)
class Target:
    name: str
    check: Callable[[bytes], None]
    seeds: Callable[[], list[bytes]]
    instrument: tuple[str, ...]  # the modules atheris instruments for coverage
    memory: tuple[int, int] | None = None  # (per input byte, constant): tracemalloc peak bound
    guide: Callable[[bytes], object] | None = None  # pure Python run first, for coverage feedback only


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

def _timed(name: str, start: float) -> None:
    spent = time.process_time() - start
    if spent > CPU_SECONDS:
        raise Finding(f"{name}: {spent:.2f} s of CPU on one input (a hang)")


def pillow_verdict(data: bytes, whole: bool = True) -> bool:
    """Whether Pillow decodes the stream at 1/8 scale, entropy data and all: handed it whole (the
    validation's decode, datapipe.decode._decode_for_validation, the verdict the skeleton must keep),
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
    from datapipe.jpeg_markers import skeleton

    start = time.process_time()
    kept = skeleton(data)
    _timed("skeleton", start)
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
    """(height, width) from the header, as datapipe.transforms reads it before the region decode."""
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
    _timed("decode_region", start)
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
    _timed("tar", start)


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
    _timed("idx", start)


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
    _timed("manifest", start)


def _region_guide(data: bytes) -> object:
    """The C decoder has no coverage instrumentation (gcc, see fuzz/README.md): the marker walk of
    the same bytes tells the fuzzer when an input has a new segment structure."""
    from datapipe.jpeg_markers import skeleton

    return skeleton(data[5:])


TARGETS: dict[str, Target] = {t.name: t for t in (
    Target("jpeg_markers", check_jpeg_markers, fixture_jpegs, ("datapipe.jpeg_markers",)),
    Target("jpeg_region", check_jpeg_region, region_seeds, ("datapipe.jpeg_markers",), guide=_region_guide),
    Target("tar", check_tar, tar_seeds, ("datapipe.formats.tar", "tarfile"), memory=(4, 1 << 20)),
    Target("idx", check_idx, idx_seeds, ("datapipe.formats.tar", "datapipe.formats.wds"), memory=(64, 1 << 20)),
    Target("manifest", check_manifest, manifest_seeds, ("datapipe.records", "datapipe.formats.wds",
                                                        "datapipe.formats.tar", "json"), memory=(64, 4 << 20)),
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


# --- parquet: the Hub-layout Parquet reader (datapipe.formats.parquet) and its converter's plan ----------

PARQUET_MEMORY = 256 << 20  # bytes of peak RSS growth allowed per input (+ 64 a byte of input): the inferred
# class list at its cap (records.MAX_INFERRED_CLASSES: 10^6 names, ~63 MB) fits; pyarrow's buffers count too
_PARQUET_DIR: Path | None = None


def parquet_seeds() -> list[bytes]:
    """Small Hub-layout files: ClassLabel names and Image structs (uncompressed, plain: a mutation
    lands in the values), no metadata with a uint8 label and a caption that is not UTF-8, and a
    Sequence(ClassLabel) list column with captions (snappy, dictionary-encoded)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    image = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    images = [{"bytes": f"img{i}".encode(), "path": f"{i}.jpg"} for i in range(6)]
    hub = {"image": {"_type": "Image"}, "label": {"_type": "ClassLabel", "names": ["dog", "cat", "fish"]},
           "tags": {"_type": "Sequence", "feature": {"_type": "ClassLabel", "names": ["a", "b", "c", "d"]}}}
    meta = {b"huggingface": json.dumps({"info": {"features": hub}}).encode()}
    tables = [
        (pa.table({"image": pa.array(images, image), "label": pa.array([0, 1, 2, 0, -1, None], pa.int64())},
                  schema=pa.schema([("image", image), ("label", pa.int64())], metadata=meta)),
         dict(compression="none", use_dictionary=False, row_group_size=3)),
        (pa.table({"image": pa.array([f"img{i}".encode() for i in range(4)], pa.binary()),
                   "label": pa.array([3, None, 0, 250], pa.uint8()),
                   "caption": pa.array([b"one", b"\xff two", None, b"four"], pa.binary()).view(pa.string())}),
         dict(compression="none", row_group_size=2)),
        (pa.table({"image": pa.array(images, image), "caption": pa.array([f"c {i}" for i in range(6)]),
                   "tags": pa.array([[0, 1], [], None, [3], [2, 9], [1]], pa.list_(pa.int64()))},
                  schema=pa.schema([("image", image), ("caption", pa.string()), ("tags", pa.list_(pa.int64()))],
                                   metadata=meta)),
         dict(compression="snappy", row_group_size=4)),
    ]
    out = []
    for table, options in tables:
        buf = io.BytesIO()
        pq.write_table(table, buf, **options)
        out.append(buf.getvalue())
    return out


def _peak_rss() -> int | None:
    """This process's peak resident memory in bytes since the last _reset_peak_rss (None: not on Linux)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            return next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmHWM:"))
    except (OSError, StopIteration, ValueError):
        return None


def _reset_peak_rss() -> int | None:
    """Reset the peak (Linux: clear_refs 5) and return the resident memory now; None where that fails."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
            fh.write("5")
    except OSError:
        return None
    return _peak_rss()


def check_parquet(data: bytes) -> None:
    """The input as `train-00000-of-00001.parquet`: opened in place (ParquetDataset: footer, column
    types, classes) and its first records read, then planned for conversion (converters.parquet:
    every row's label, caption and ids) and its first rows' images read as a worker does. Opening
    and planning raise ValueError (the one-line errors) or succeed; a record raises ValueError (a
    bad record), OSError or a pyarrow error (a row group that cannot be read: the loader's on_error
    serves around it); a worker's row read, BadImageError. In time (CPU), and within PARQUET_MEMORY
    of peak RSS (pyarrow's buffers are outside tracemalloc's view)."""
    import pyarrow as pa

    from converters.inputs import open_input
    from converters.parquet import scan_parquet
    from datapipe.formats.parquet import ParquetDataset
    from datapipe.headers import BadImageError

    global _PARQUET_DIR
    if _PARQUET_DIR is None:
        _PARQUET_DIR = Path(tempfile.mkdtemp(prefix="datapipe-fuzz-parquet-"))
        atexit.register(shutil.rmtree, _PARQUET_DIR, True)
    path = _PARQUET_DIR / "train-00000-of-00001.parquet"
    path.write_bytes(data)
    base, start = _reset_peak_rss(), time.process_time()
    try:
        ds = ParquetDataset(str(path))
    except ValueError:
        ds = None
    for i in range(min(len(ds), 8) if ds is not None else 0):
        try:
            ds.record(i)
        except (ValueError, OSError, pa.ArrowException):
            pass
    try:
        layout = scan_parquet(path)
    except ValueError:
        layout = None
    for file in (layout.splits.get("train", [])[:8] if layout is not None else ()):
        try:
            with open_input(file.path) as fh:
                fh.read()
        except BadImageError:
            pass
    _timed("parquet", start)
    peak = _peak_rss()
    if base is not None and peak is not None and peak - base > PARQUET_MEMORY + 64 * len(data):
        raise Finding(f"parquet: peak RSS grew {(peak - base) >> 20} MiB for a {len(data)}-byte input")


TARGETS["parquet"] = Target("parquet", check_parquet, parquet_seeds, (
    "datapipe.formats.parquet", "datapipe.formats.parquet_schema", "converters.parquet"))


# --- sidecars: an image folder's NAME.txt / NAME.json, read by the scan (#38 row 3) ----------------
# Self-contained: its seeds, check and registration. An input is one flag byte, then the caption's
# bytes, "\n--\n", the metadata's bytes. Flag bits: 1 writes NAME.txt, 2 NAME.json, 4 makes NAME.txt
# a link to a file outside the dataset, 8 makes NAME.json a FIFO, 16 makes NAME.txt a link to
# /dev/zero, 32 makes NAME.txt a link inside the dataset.

SIDECAR_SECRET = b"not a caption: a file outside the dataset"
_SIDECAR_DIR: Path | None = None


def _sidecar_dir() -> Path:
    """tmp/outside (the file links point out to) and tmp/ds/c/x.jpg (the image; its bytes are never
    decoded by the scan), made once per process."""
    global _SIDECAR_DIR
    if _SIDECAR_DIR is None:
        _SIDECAR_DIR = Path(tempfile.mkdtemp(prefix="datapipe-fuzz-sidecars-"))
        atexit.register(shutil.rmtree, _SIDECAR_DIR, True)
        (_SIDECAR_DIR / "outside").write_bytes(SIDECAR_SECRET)
        (_SIDECAR_DIR / "ds" / "c").mkdir(parents=True)
        (_SIDECAR_DIR / "ds" / "c" / "x.jpg").write_bytes(b"\xff\xd8\xff\xd9")
    return _SIDECAR_DIR


def sidecar_seeds() -> list[bytes]:
    meta = json.dumps({"url": "http://x.example/é.jpg", "tags": ["a", None], "w": 1.5}).encode()
    bodies = (b"a caption\n--\n" + meta, "caf\u00e9 au lait\r\n--\n{}".encode(), b"caf\xe9\n--\n[1, 2]",
              b"\n--\n" + b"[" * 3000 + b"]" * 3000, b"x" * 300 + b"\n--\n{\"a\": 1e999}")
    return [bytes([flags]) + body for flags in (1, 2, 3, 5, 11, 17, 33, 35) for body in bodies]


def _plant_sidecars(data: bytes) -> tuple[Path, int]:
    """The folder with x.txt / x.json as the input says; (its root, the flag byte)."""
    import os

    tmp = _sidecar_dir()
    flags, (text, _, meta) = (data[0] if data else 0), data[1:].partition(b"\n--\n")
    folder = tmp / "ds" / "c"
    for name in ("x.txt", "x.json", "inside.txt"):
        (folder / name).unlink(missing_ok=True)
    (folder / "inside.txt").write_bytes(text)
    if flags & 1:
        txt = folder / "x.txt"
        if flags & 4:
            txt.symlink_to(tmp / "outside")
        elif flags & 16:
            txt.symlink_to("/dev/zero")
        elif flags & 32:
            txt.symlink_to("inside.txt")
        else:
            txt.write_bytes(text)
    if flags & 2:
        os.mkfifo(folder / "x.json") if flags & 8 else (folder / "x.json").write_bytes(meta)
    return tmp / "ds", flags


def check_sidecars(data: bytes) -> None:
    """scan_folder over one image and its sidecars: the image is in the split with the fields
    field_text makes of the bytes, or skipped with a one-line reason naming its sidecar; a link out
    of the dataset, /dev/zero or a FIFO is always skipped (never read, never blocking); nothing else
    raised, in time, within the memory bound."""
    import re

    from datapipe import field_text
    from datapipe.records import Fields
    from datapipe.scan import scan_folder

    root, flags = _plant_sidecars(data)
    start = time.process_time()
    layout = scan_folder(root)
    _timed("sidecars", start)
    files, skipped = layout.splits["train"], layout.skipped["train"]
    if skipped:
        reason = skipped[0]["reason"]
        named = re.match(r"(caption |metadata )?c/x\.(txt|json) ", reason)
        if len(skipped) != 1 or files or "\n" in reason or not named:
            raise Finding(f"the bad sidecar's skip is not one line naming it: {skipped!r:.300}")
        return
    if flags & 1 and flags & 20 or flags & 2 and flags & 8:
        raise Finding(f"a sidecar linking out of the dataset or to a FIFO was read (flags {flags})")
    text, _, meta = data[1:].partition(b"\n--\n")
    want = Fields(field_text.caption(text, "t", strip_newline=True) if flags & 1 else None,
                  field_text.metadata(meta, "m") if flags & 2 else None)
    got = files[0].fields
    if (got.text, got.meta) != (want.text, want.meta):
        raise Finding(f"fields {got!r:.200} read from sidecars that make {want!r:.200}")


TARGETS["sidecars"] = Target("sidecars", check_sidecars, sidecar_seeds,
                             ("datapipe.scan", "datapipe.dataset_files", "datapipe.field_text", "json"),
                             memory=(64, 4 << 20))
