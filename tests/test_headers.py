"""The pure-Python header reader against the Pillow path it stands in for.

`old_image_dims` below is datapipe's image_dims as it was before the reader existed (commit ed3a23d:
simplejpeg's header, Pillow for EXIF and everything else). datapipe.image.layout.image_dims must give what
it gave on every input, value or exception type; header_layout must answer for ordinary files (else
the test proves only the fallback) and never raise.
"""
from __future__ import annotations

import inspect
import io
import random
import re
import struct
import zlib
from pathlib import Path

import pytest
import simplejpeg
from PIL import Image

from datapipe.image import exif

from datapipe.image import headers
from datapipe.image.decode import exif_orientation, open_image, upright_image_size
from datapipe.image.headers import header_layout, jpeg_scan_start
from datapipe.image.layout import image_dims
from datapipe.image.orientation import upright_size
from tests.conftest import FIXTURES

pytestmark = [pytest.mark.filterwarnings("ignore"),  # Pillow warns about the corrupt EXIF we feed it
              pytest.mark.forked]  # tracemalloc in a child with one thread (tests/forked.py)
IMAGENET_LIKE = Path(__file__).resolve().parents[1] / "build" / "imagenet-like"


def old_image_dims(data: bytes) -> tuple[int, int]:
    """image_dims before the header reader, verbatim."""
    layout = None
    if data.startswith(b"\xff\xd8\xff"):
        try:
            height, width, colorspace, _ = simplejpeg.decode_jpeg_header(data)
        except ValueError:
            colorspace = None
        if colorspace in ("YCbCr", "Gray") and width * height <= Image.MAX_IMAGE_PIXELS:
            orientation = exif_orientation(open_image(data)) if b"Exif\x00\x00" in data[:65536] else 1
            layout = width, height, orientation
    return upright_size(*layout) if layout else upright_image_size(open_image(data))


def outcome(data: bytes):
    try:
        return old_image_dims(data)
    except Exception as exc:
        return type(exc).__name__


def assert_same(data: bytes) -> tuple[int, int, int] | None:
    """image_dims(data) == the old one (value or exception type); header_layout never raises."""
    layout = header_layout(data)
    assert layout is None or (len(layout) == 3 and all(isinstance(v, int) for v in layout))
    try:
        new = image_dims(data)
    except Exception as exc:
        new = type(exc).__name__
    assert new == outcome(data)
    return layout


# -- synthetic files --------------------------------------------------------------------------------------

def tiff(order: str, entries: list[tuple[int, int, int, bytes]], ifd_at: int = 8, tail: bytes = b"") -> bytes:
    """A TIFF header and IFD0 (tag, type, count, 4-byte field), then `tail`."""
    e = "<" if order == "II" else ">"
    head = (b"II*\x00" if order == "II" else b"MM\x00*") + struct.pack(e + "I", ifd_at)
    ifd = struct.pack(e + "H", len(entries))
    ifd += b"".join(struct.pack(e + "HHI", tag, kind, count) + field for tag, kind, count, field in entries)
    return head + b"\x00" * (ifd_at - 8) + ifd + b"\x00\x00\x00\x00" + tail


def short(order: str, value: int) -> bytes:
    return struct.pack("<H" if order == "II" else ">H", value) + b"\x00\x00"


def orientation_exif(order: str, value: int) -> bytes:
    return b"Exif\x00\x00" + tiff(order, [(0x0112, 3, 1, short(order, value))])


def segment(marker: int, body: bytes) -> bytes:
    return bytes([0xFF, marker]) + struct.pack(">H", len(body) + 2) + body


def jpeg(mode: str = "RGB", size=(40, 24), *segments: bytes, **save) -> bytes:
    """A real JPEG with `segments` (whole marker segments) right after SOI."""
    out = io.BytesIO()
    Image.new(mode, size, 90).save(out, "JPEG", **save)
    data = out.getvalue()
    return data[:2] + b"".join(segments) + data[2:]


def chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2))
CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}


def png(width, height, depth=8, ctype=2, interlaced=False, before=(), after=(), bad_filter=False, seed=0) -> bytes:
    """A PNG written here (Pillow writes no interlaced ones): random pixels and filter types, the
    chunks `before` IDAT and `after` it, the last row's filter type 5 if `bad_filter`."""
    rng, bits = random.Random(seed), depth * CHANNELS[ctype]
    passes = ADAM7 if interlaced else ((0, 0, 1, 1),)
    rows = []
    for col, row, cs, rs in passes:
        cols, count = -(-(width - col) // cs), -(-(height - row) // rs)
        if cols > 0 and count > 0:
            rows += [bytes([rng.randrange(5)]) + rng.randbytes((cols * bits + 7) // 8) for _ in range(count)]
    if bad_filter:
        rows[-1] = b"\x05" + rows[-1][1:]
    plte = [chunk(b"PLTE", bytes(i % 256 for i in range(3 * 2 ** depth)))] if ctype == 3 else []
    ihdr = chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, depth, ctype, 0, 0, int(interlaced)))
    pixels = chunk(b"IDAT", zlib.compress(b"".join(rows)))
    return b"\x89PNG\r\n\x1a\n" + ihdr + b"".join(plte + list(before)) + pixels + b"".join(after) + chunk(b"IEND", b"")


# -- real files ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", sorted(p for p in FIXTURES.rglob("*") if p.is_file()), ids=lambda p: p.name)
def test_every_fixture_reads_as_pillow_reads_it(path):
    data = path.read_bytes()
    layout = assert_same(data)
    if headers.image_ext(data) and not isinstance(outcome(data), str):
        assert layout is not None  # ordinary files (CMYK, gray, progressive, rotated, PNG modes) take the reader
        assert upright_size(*layout) == outcome(data)


@pytest.mark.skipif(not IMAGENET_LIKE.is_dir(), reason="build/imagenet-like not made (tools/ sample maker)")
def test_the_imagenet_like_set_reads_as_pillow_reads_it():
    files = sorted(p for p in IMAGENET_LIKE.rglob("*") if p.is_file())
    answered = sum(assert_same(p.read_bytes()) is not None for p in files)
    assert answered >= len(files) - 10


# -- EXIF, XMP ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("order", ["II", "MM"])
@pytest.mark.parametrize("value", range(0, 10))
def test_each_exif_orientation_in_both_byte_orders(order, value):
    upright = (24, 40) if value in (5, 6, 7, 8) else (40, 24)
    for data in (jpeg("RGB", (40, 24), segment(0xE1, orientation_exif(order, value))),
                 jpeg("CMYK", (40, 24), segment(0xE1, orientation_exif(order, value))),
                 jpeg("L", (40, 24), segment(0xE1, orientation_exif(order, value)), progressive=True),
                 png(40, 24, before=[chunk(b"eXIf", orientation_exif(order, value)[6:])]),
                 png(40, 24, 16, 6, interlaced=True, after=[chunk(b"eXIf", orientation_exif(order, value)[6:])])):
        assert assert_same(data) == (40, 24, value or 1)
        assert image_dims(data) == upright


def odd_exif(order: str) -> dict[str, bytes]:
    """EXIF payloads (or whole JPEGs) Pillow reads in its own way."""
    six, eight, e = short(order, 6), short(order, 8), "<" if order == "II" else ">"
    exif = lambda entries, **kw: b"Exif\x00\x00" + tiff(order, entries, **kw)  # noqa: E731
    return {
        "truncated APP1 segment": jpeg("RGB", (40, 24), segment(0xE1, orientation_exif(order, 6)))[:30],
        "IFD past the segment": b"Exif\x00\x00" + tiff(order, [(0x0112, 3, 1, six)])[:4] + struct.pack(e + "I", 4000),
        "entries cut short": exif([(0x010F, 2, 3, b"ab\x00\x00"), (0x0112, 3, 1, six)])[:-20],
        "value past the blob": exif([(0x010F, 2, 40, struct.pack(e + "I", 900)), (0x0112, 3, 1, six)]),
        "value larger than the blob": exif([(0x010F, 7, 10 ** 9, b"\x00" * 4), (0x0112, 3, 1, six)]),
        "repeated tag: the first wins": exif([(0x0112, 3, 1, six), (0x0112, 3, 1, eight)]),
        "unknown type skipped": exif([(0x0112, 99, 1, eight), (0x0112, 3, 1, six)]),
        "orientation as LONG": exif([(0x0112, 4, 1, struct.pack(e + "I", 6))]),
        "three SHORTs out of line": exif([(0x0112, 3, 3, struct.pack(e + "I", 26))],
                                         tail=struct.pack(e + "HHH", 8, 1, 1)),
        "IFD at an odd place": exif([(0x0112, 3, 1, six)], ifd_at=11),
        "no entries": exif([]),
        "Exif twice": b"Exif\x00\x00" + orientation_exif(order, 6),
        "not TIFF": b"Exif\x00\x00XX*\x00\x08\x00\x00\x00",
        "short TIFF header": b"Exif\x00\x00" + (b"II*\x00" if order == "II" else b"MM\x00*"),
        "empty": b"Exif\x00\x00",
        "XResolution as ASCII": exif([(0x011A, 2, 2, b"7\x00\x00\x00"), (0x0112, 3, 1, six)]),
    }


@pytest.mark.parametrize("order", ["II", "MM"])
@pytest.mark.parametrize("case", list(odd_exif("II")))
def test_odd_exif_reads_as_pillow_reads_it(order, case):
    body = odd_exif(order)[case]
    assert_same(body if body.startswith(b"\xff\xd8") else jpeg("RGB", (40, 24), segment(0xE1, body)))
    assert_same(png(40, 24, before=[chunk(b"eXIf", body[6:])]))
    assert_same(png(40, 24, after=[chunk(b"eXIf", body[6:])]))


def test_xmp_and_late_exif_take_the_old_paths_answer():
    xmp = segment(0xE1, b"http://ns.adobe.com/xap/1.0/\x00<x tiff:Orientation=\"6\"/>")
    no_tag = segment(0xE1, b"Exif\x00\x00" + tiff("II", [(0x010F, 2, 2, b"a\x00\x00\x00")]))
    assert assert_same(jpeg("RGB", (40, 24), no_tag, xmp)) == (40, 24, 6)  # EXIF without the tag: XMP's
    assert assert_same(jpeg("RGB", (40, 24), xmp)) is None  # XMP alone: libjpeg's verdict decides, so Pillow's path
    assert assert_same(jpeg("CMYK", (40, 24), xmp)) is None
    padding = segment(0xFE, b"c" * 65000)
    late = jpeg("RGB", (40, 24), padding, padding, segment(0xE1, orientation_exif("MM", 6)))
    assert assert_same(late) is None and image_dims(late) == (40, 24)  # EXIF past 64 KiB: never read there


def test_segments_pillow_fails_on_defer_to_it():
    for segments in ([segment(0xE0, b"JFIF\x00")], [segment(0xEE, b"Adobe\x00")],
                     [segment(0xE2, b"ICC_PROFILE\x00\x01")], [segment(0xED, b"Photoshop 3.0\x008BIM\x03\xed")],
                     [segment(0xE2, b"MPF\x00II*\x00")], [segment(0xDB, b"\x00" + b"\x01" * 10)],
                     [b"\xff\xff"], [b"\xff\xd0"]):
        assert_same(jpeg("RGB", (40, 24), *segments))
    assert assert_same(jpeg("RGB", (40, 24), segment(0xED, b"Photoshop 3.0\x008BIM\x03\xed\x00\x00"))) is not None


# -- PNG pixel data: Pillow decodes it to look for EXIF after it ---------------------------------------------

@pytest.mark.parametrize("depth, ctype", [(1, 0), (2, 0), (4, 0), (8, 0), (16, 0), (8, 2), (16, 2), (1, 3), (2, 3),
                                          (4, 3), (8, 3), (8, 4), (16, 4), (8, 6), (16, 6)])
@pytest.mark.parametrize("interlaced", [False, True])
def test_png_pixel_data_is_checked_as_pillow_decodes_it(depth, ctype, interlaced):
    for width, height in ((1, 1), (3, 5), (9, 2), (17, 13)):
        assert assert_same(png(width, height, depth, ctype, interlaced)) == (width, height, 1)
        assert assert_same(png(width, height, depth, ctype, interlaced, bad_filter=True)) is None
    data = png(17, 13, depth, ctype, interlaced)
    start = data.index(b"IDAT") + 4
    cut = data[:start - 8] + chunk(b"IDAT", data[start:data.index(b"IEND") - 8][:-9]) + chunk(b"IEND", b"")
    assert assert_same(cut) is None
    eight = [chunk(b"eXIf", orientation_exif("II", 8)[6:])]
    exif_first = png(17, 13, depth, ctype, interlaced, before=eight, bad_filter=True)
    assert assert_same(exif_first) == (17, 13, 8)  # Pillow never decodes it


def test_png_chunks_pillow_treats_specially_defer_to_it():
    xmp = b"XML:com.adobe.xmp\x00tiff:Orientation=\"6\""
    for extra in ([chunk(b"tEXt", b"interlace\x001")], [chunk(b"tEXt", xmp)],
                  [chunk(b"zTXt", b"k\x00\x00" + zlib.compress(b"v"))], [chunk(b"gAMA", b"\x00")],
                  [chunk(b"iCCP", b"p\x00\x00" + zlib.compress(b"\x00" * 2_000_000))], [chunk(b"acTL", b"\x00" * 8)]):
        assert assert_same(png(8, 8, before=extra)) is None
        assert_same(png(8, 8, after=extra))
    plain = [chunk(b"tEXt", b"Software\x00x"), chunk(b"iCCP", b"p\x00\x00" + zlib.compress(b"\x01" * 300)),
             chunk(b"pHYs", b"\x00" * 9), chunk(b"tIME", b"\x07\xe8\x01\x01\x00\x00\x00")]
    assert assert_same(png(8, 8, before=plain, after=plain)) == (8, 8, 1)


# -- mutations -------------------------------------------------------------------------------------------------

def _bases() -> list[bytes]:
    rich = jpeg("RGB", (50, 30), segment(0xE0, b"JFIF\x00\x01\x01\x01\x00H\x00H\x00\x00"),
                segment(0xE1, orientation_exif("MM", 6)), segment(0xE2, b"ICC_PROFILE\x00\x01\x01" + b"p" * 40),
                segment(0xED, b"Photoshop 3.0\x008BIM\x04\x04\x00\x00\x00\x00\x00\x02ab"),
                segment(0xE1, b"http://ns.adobe.com/xap/1.0/\x00<x tiff:Orientation=\"3\"/>"))
    files = [p.read_bytes() for p in sorted((FIXTURES / "imagefolder/train").rglob("*")) if p.suffix.lower() in
             (".jpg", ".jpeg", ".png") and 0 < p.stat().st_size < 20000]
    return files + [rich, png(20, 9, 8, 3, True, after=[chunk(b"eXIf", orientation_exif("MM", 5)[6:])]),
                    png(12, 7, 16, 2, before=[chunk(b"eXIf", orientation_exif("II", 7)[6:])])]


def _mutate(data: bytes, rng: random.Random) -> bytes:
    """Cut, overwrite, insert or delete header bytes; set a JPEG segment's length field; or change a
    PNG chunk's data and give it a valid CRC (so the mutation reaches the reader's model)."""
    out, kind = bytearray(data), rng.randrange(5)
    is_jpeg = data[:2] == b"\xff\xd8"
    head = min(len(data), max(jpeg_scan_start(data) + 12, 64)) if is_jpeg else len(data)
    if kind == 0:
        return data[:rng.randrange(len(data))]
    if kind == 1:
        for _ in range(rng.randint(1, 3)):
            out[rng.randrange(head)] = rng.choice([0, 1, 2, 0x7F, 0xFF, rng.randrange(256)])
    elif kind == 2:
        at = rng.randrange(head)
        out[at:at] = rng.randbytes(rng.randint(1, 4))
        del out[at + rng.randint(0, 4):at + rng.randint(4, 8)]
    elif is_jpeg:
        spans = [pos for pos, _, end in headers.jpeg_segments(data) if end >= pos + 4]
        if spans:
            pos = rng.choice(spans)
            length = int.from_bytes(data[pos + 2:pos + 4], "big")
            value = rng.choice([0, 1, 2, 3, length - 1, length + 1, 0xFFFF, rng.randrange(0x10000)])
            out[pos + 2:pos + 4] = max(0, min(value, 0xFFFF)).to_bytes(2, "big")
    elif data[:4] == b"\x89PNG" and len(data) >= 20:
        pos, spans = 8, []
        while pos + 12 <= len(data):
            spans.append((pos, int.from_bytes(data[pos:pos + 4], "big")))
            pos += 12 + spans[-1][1]
        pos, length = rng.choice(spans)
        body = bytearray(data[pos + 8:pos + 8 + length])
        if body:
            body[rng.randrange(len(body))] = rng.randrange(256)
        return data[:pos] + chunk(data[pos + 4:pos + 8], bytes(body)) + data[pos + 12 + length:]
    return bytes(out)


def test_mutated_headers_read_as_pillow_reads_them():
    rng = random.Random(24)
    for base in _bases():
        for _ in range(120):
            assert_same(_mutate(base, rng))


def test_jpeg_scan_start_walks_as_before():
    def old(data: bytes) -> int:
        pos = 2
        while pos + 4 <= len(data):
            if data[pos] != 0xFF:
                return -1
            marker = data[pos + 1]
            if marker == 0xDA:
                return pos
            if marker == 0xFF or 0xD0 <= marker <= 0xD8 or marker == 0x01:
                pos += 1 if marker == 0xFF else 2
                continue
            pos += 2 + int.from_bytes(data[pos + 2:pos + 4], "big")
        return -1

    rng = random.Random(5)
    for base in _bases()[:-2]:
        for data in [base] + [_mutate(base, rng) for _ in range(60)]:
            assert jpeg_scan_start(data) == old(data)


# -- bounds ----------------------------------------------------------------------------------------------------

def test_crafted_sizes_allocate_nothing_they_claim():
    """A 1 x 1 PNG whose pixel data inflates to 64 MiB, and an IFD of 65535 entries claiming 4 GB
    values: the reader gives up or skips without allocating what they claim (Pillow decides the PNG)."""
    import tracemalloc

    bomb = png(1, 1)
    bomb = bomb[:bomb.index(b"IDAT") - 4] + chunk(b"IDAT", zlib.compress(b"\x00" * (64 << 20), 9)) + chunk(b"IEND", b"")
    entries = b"".join(struct.pack("<HHII", 0x0200 + i % 300, 7, 0xFFFFFFFF, 8) for i in range(65535))
    ifd = jpeg("RGB", (40, 24), segment(0xE1, b"Exif\x00\x00II*\x00\x08\x00\x00\x00\xff\xff" + entries[:60000]))
    tracemalloc.start()
    try:
        assert header_layout(bomb) is None
        assert header_layout(ifd) == (40, 24, 1)
        assert tracemalloc.get_traced_memory()[1] < 8 << 20
    finally:
        tracemalloc.stop()
    assert_same(bomb)
    assert_same(ifd)


def test_pillow_settings_are_followed(monkeypatch):
    data = png(40, 24)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 500)
    assert header_layout(data) is None
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", None)
    assert header_layout(data) is None
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 10 ** 6)
    monkeypatch.setattr("PIL.ImageFile.LOAD_TRUNCATED_IMAGES", True)
    assert header_layout(data) is None


def test_the_parts_of_pillow_the_reader_follows_are_still_these():
    """Against a Pillow upgrade: the TIFF types Pillow loads, the PNG chunks it handles and the info
    keys its PNG reader uses are the ones the reader was written for."""
    from PIL import PngImagePlugin, TiffImagePlugin

    assert {k: v[0] for k, v in TiffImagePlugin.ImageFileDirectory_v2._load_dispatch.items()} == exif._TIFF_UNIT
    handled = {name[6:].encode() for name in dir(PngImagePlugin.PngStream) if name.startswith("chunk_")}
    followed = {b"PLTE", b"tRNS", b"gAMA", b"cHRM", b"sRGB", b"pHYs", b"tEXt", b"iTXt", b"eXIf", b"iCCP"}
    assert handled <= followed | headers._UNFOLLOWED
    keys = set(re.findall(r'(?:im_info|self\.info)\["([^"]+)"\]', inspect.getsource(PngImagePlugin)))
    assert keys <= headers._PILLOW_KEYS
    assert headers.PILLOW_MAX_PIXELS == Image.MAX_IMAGE_PIXELS
