"""What an encoded image's header says, read without decoding it and without Pillow: its format, where
a JPEG's first scan starts, and a JPEG's or PNG's stored size and EXIF orientation.

`header_layout(data)` gives (stored width, stored height, EXIF orientation) exactly as datapipe's
Pillow path does (datapipe.image.layout), or None wherever it cannot be sure; the caller then asks Pillow.
Exactly includes how Pillow 13 reads odd files, so the reader follows Pillow's readers and says None
outside what it follows (tests/test_headers.py compares the two on real and mutated files):
- JPEG: the segments up to the first scan, each as Pillow's JPEG reader takes it (one it fails on, an
  MPO index, fill bytes or a second frame header: None); the orientation from the EXIF APP1 (IFD0 tag
  0x0112, either byte order) or, where it has none, from XMP, as `Image.getexif` reads them (datapipe.image.exif).
- PNG: every chunk up to IEND with its CRC, the size from IHDR, the orientation from eXIf. Pillow
  reads the EXIF of a PNG with no eXIf before its pixel data only after decoding the whole image, so
  such a PNG fails there when its pixel data is damaged; the reader inflates that data (zlib, no
  unfiltering) and checks each row's filter type, and says None unless all of it is clean.

The bytes come from datasets other people made: every offset is checked against the data before it
is read, nothing is allocated by a size the data claims, and every loop is bounded by the data's
length (docs/security.md).
"""
from __future__ import annotations

import sys
import zlib
from collections.abc import Iterator

from .exif import orientation_of

PILLOW_MAX_PIXELS = 1024 * 1024 * 1024 // 4 // 3  # Pillow's default Image.MAX_IMAGE_PIXELS
Layout = tuple[int, int, int]  # stored width, stored height, EXIF orientation
Chunks = list[tuple[bytes, int, int]]  # PNG chunks: type, start and end of the data
_MAGIC = ((b"\xff\xd8\xff", "jpg"), (b"\x89PNG\r\n\x1a\n", "png"))
_LIMIT = 1 << 20  # Pillow's SAFEBLOCK: its cap on a PNG text or ICC chunk, inflated; also our text budget
_PIECE = 1 << 16  # compressed bytes handed to zlib at a time (its unconsumed tail is copied on each call)

# JPEG markers: the frame headers Pillow takes the size from, and the segments it reads past
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_PASSED = frozenset({0xC4, 0xCC, 0xDD, 0xFE})  # DHT, DAC, DRI, COM
_SOS, _DQT = 0xDA, 0xDB
_XMP_NS = b"http://ns.adobe.com/xap/1.0/\x00"

# PNG: (bit depth, colour type) -> (Pillow's mode, bits per pixel)
_PNG_MODES = {(1, 0): ("1", 1), (2, 0): ("L", 2), (4, 0): ("L", 4), (8, 0): ("L", 8), (16, 0): ("I;16", 16),
              (8, 2): ("RGB", 24), (16, 2): ("RGB", 48), (1, 3): ("P", 1), (2, 3): ("P", 2), (4, 3): ("P", 4),
              (8, 3): ("P", 8), (8, 4): ("LA", 16), (16, 4): ("RGBA", 32), (8, 6): ("RGBA", 32),
              (16, 6): ("RGBA", 64)}
_SHORTEST = {b"gAMA": 4, b"cHRM": 32, b"sRGB": 1, b"pHYs": 9}  # shorter ones fail in Pillow
_TRNS_SHORTEST = {"1": 2, "L": 2, "I;16": 2, "RGB": 6}
# chunks Pillow handles that this reader does not follow here (or at all): None
_UNFOLLOWED = frozenset({b"IHDR", b"IDAT", b"IEND", b"zTXt", b"acTL", b"fcTL", b"fdAT", b"DDAT"})
# info keys Pillow's PNG reader sets or reads itself: a text chunk with one of these names changes its reading
_PILLOW_KEYS = frozenset({"aspect", "bbox", "blend", "chromaticity", "default_image", "disposal", "dpi", "duration",
                          "exif", "gamma", "icc_profile", "interlace", "loop", "srgb", "transparency", "xmp",
                          "Raw profile type exif", "XML:com.adobe.xmp"})
_VALID_FILTERS = bytes(range(5))
# Adam7 passes: first column, first row, column step, row step (Pillow's ZipDecode.c tables)
_ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2))


class BadImageError(ValueError):
    """An input that is not a usable image; the message is the reason reported for it."""


def image_ext(data: bytes) -> str | None:
    """'jpg' or 'png' from the magic bytes (not the file name), else None."""
    for magic, ext in _MAGIC:
        if data.startswith(magic):
            return ext
    return None


def jpeg_segments(data: bytes) -> Iterator[tuple[int, int, int]]:
    """(offset, marker, end) of a JPEG's marker segments after SOI, up to and including the first SOS.
    Fill bytes (FF FF) are stepped over; RSTn, SOI and TEM have no length (end = offset + 2). The walk
    stops at a byte that is not a marker, or with fewer than 4 bytes left; `end` is what the length
    field says and may lie past the data (callers check)."""
    pos = 2
    while pos + 4 <= len(data):
        if data[pos] != 0xFF:
            return
        marker = data[pos + 1]
        if marker == 0xFF:
            pos += 1
            continue
        if 0xD0 <= marker <= 0xD8 or marker == 0x01:
            yield pos, marker, pos + 2
            pos += 2
            continue
        end = pos + 2 + int.from_bytes(data[pos + 2:pos + 4], "big")
        yield pos, marker, end
        if marker == _SOS:
            return
        pos = end


def jpeg_scan_start(data: bytes) -> int:
    """Offset of the first SOS marker, found by walking the segments (so a thumbnail's EOI inside
    APP1 is skipped); -1 when the header is malformed or has no scan."""
    return next((pos for pos, marker, _ in jpeg_segments(data) if marker == _SOS), -1)


def header_layout(data: bytes) -> Layout | None:
    """(stored width, stored height, EXIF orientation) of a JPEG or PNG as datapipe's Pillow path
    reads it, or None where this reader is not sure (see the module docstring)."""
    ext = image_ext(data)
    if ext == "jpg":
        return _jpeg_layout(data)
    return _png_layout(data) if ext == "png" else None


def _pillow_opens(width: int, height: int) -> bool:
    """Whether Pillow, as this process has it set, opens a width x height image without its
    decompression-bomb error; this reader follows Pillow's strict reading only."""
    image, imagefile = sys.modules.get("PIL.Image"), sys.modules.get("PIL.ImageFile")
    limit = PILLOW_MAX_PIXELS if image is None else image.MAX_IMAGE_PIXELS
    strict = imagefile is None or not imagefile.LOAD_TRUNCATED_IMAGES
    return strict and limit is not None and 0 < width * height <= limit


def _jpeg_layout(data: bytes) -> Layout | None:
    size: tuple[int, int] | None = None
    exif = xmp = None
    expect = 2
    for pos, marker, end in jpeg_segments(data):
        if pos != expect or end < pos + 4 or end > len(data):
            return None  # fill bytes, a marker without a length, a length < 2 or past the end
        body = data[pos + 4:end]
        if marker == _SOS:
            return _jpeg_answer(data, size, exif, xmp)
        if marker in _SOF:
            if size is not None:
                return None
            size = _frame_size(body)
            if size is None:
                return None
        elif marker == _DQT:
            if not _tables_fit(body):
                return None
        elif 0xE0 <= marker <= 0xEF:
            kind = _app_kind(marker, body)
            if kind is None:
                return None
            if kind == "exif":  # Pillow appends a second EXIF APP1 to the first
                exif = body if exif is None else exif + body[6:]
            elif kind == "xmp":
                xmp = body.split(b"\x00", 1)[1]
        elif marker not in _PASSED:
            return None
        expect = end
    return None


def _jpeg_answer(data: bytes, size: tuple[int, int] | None, exif: bytes | None, xmp: bytes | None) -> Layout | None:
    if size is None or not _pillow_opens(*size):
        return None
    orientation = orientation_of(exif, xmp)
    if orientation is None:
        return None
    # datapipe's JPEG path reads EXIF only when "Exif\0\0" occurs in the first 64 KiB, Pillow's path
    # always; which one a file takes is libjpeg's colour-space verdict: a rotation found later is theirs
    if orientation != 1 and data.find(b"Exif\x00\x00", 0, 65536) < 0:
        return None
    return size[0], size[1], orientation


def _frame_size(sof: bytes) -> tuple[int, int] | None:
    """(width, height) of a frame header Pillow accepts: 8-bit, 1, 3 or 4 components, whole."""
    if len(sof) < 6 or (len(sof) - 6) % 3 or sof[0] != 8 or sof[5] not in (1, 3, 4):
        return None
    width, height = int.from_bytes(sof[3:5], "big"), int.from_bytes(sof[1:3], "big")
    return (width, height) if width and height else None


def _tables_fit(dqt: bytes) -> bool:
    """Whether Pillow reads every quantization table of a DQT segment (8- or 16-bit) without running out."""
    pos = 0
    while pos < len(dqt):
        pos += 65 if dqt[pos] < 16 else 129
    return pos == len(dqt)


def _app_kind(marker: int, s: bytes) -> str | None:
    """'exif' or 'xmp' for the APPn segments whose content counts, '' for others Pillow reads
    without failing, None for one it fails on (or reads as an MPO)."""
    if marker == 0xE0 and s.startswith(b"JFIF"):
        return "" if len(s) >= 7 else None  # Pillow unpacks the version at 5
    if marker == 0xE1 and s.startswith(b"Exif\x00\x00"):
        return "exif"
    if marker == 0xE1 and s.startswith(_XMP_NS):
        return "xmp"
    if marker == 0xE2 and s.startswith(b"ICC_PROFILE\x00"):
        return "" if len(s) >= 14 else None  # Pillow sorts the parts by byte 13
    if marker == 0xE2 and s.startswith(b"MPF\x00"):
        return None
    if marker == 0xED and s.startswith(b"Photoshop 3.0\x00"):
        return "" if _photoshop_fits(s) else None
    if marker == 0xEE and s.startswith(b"Adobe"):
        return "" if len(s) >= 7 else None
    return ""


def _photoshop_fits(s: bytes) -> bool:
    """False where Pillow's walk of a Photoshop APP13's resource blocks reads a name length past the
    end (an IndexError: it then reports no image); it stops quietly at any other shortfall."""
    pos = 14
    while s[pos:pos + 4] == b"8BIM":
        code, pos = int.from_bytes(s[pos + 4:pos + 6], "big"), pos + 6
        if pos > len(s):
            return True
        if pos == len(s):
            return False
        pos += 1 + s[pos]
        pos += pos & 1
        if pos + 4 > len(s):
            return True
        size, pos = int.from_bytes(s[pos:pos + 4], "big"), pos + 4
        if code == 0x03ED and len(s[pos:pos + size]) < 14:
            return True
        pos += size
        pos += pos & 1
    return True


def png_has_transparency(data: bytes) -> bool:
    """Whether a PNG carries a tRNS chunk (a palette or colour key with transparency). The chunk
    walk reads only chunk headers up to the first IDAT (tRNS must come before it): no CRC, no decode."""
    pos = 8
    while pos + 8 <= len(data):
        kind = data[pos + 4:pos + 8]
        if kind == b"tRNS":
            return True
        if kind in (b"IDAT", b"IEND"):
            return False
        pos += 12 + int.from_bytes(data[pos:pos + 4], "big")
    return False


def _png_chunks(data: bytes) -> Chunks | None:
    """(type, start, end) of each chunk's data up to and including IEND, or None unless every chunk
    lies inside the data, has a type of four ASCII letters and a valid CRC."""
    view, chunks, pos = memoryview(data), [], 8
    while pos + 12 <= len(data):
        length, kind = int.from_bytes(data[pos:pos + 4], "big"), data[pos + 4:pos + 8]
        end = pos + 8 + length
        if not kind.isalpha() or length > 0x7FFFFFFF or end + 4 > len(data):
            return None
        if zlib.crc32(view[pos + 4:end]) != int.from_bytes(data[end:end + 4], "big"):
            return None
        chunks.append((kind, pos + 8, end))
        if kind == b"IEND":
            return chunks
        pos = end + 4
    return None


def _png_layout(data: bytes) -> Layout | None:
    chunks = _png_chunks(data)
    if not chunks or chunks[0][0] != b"IHDR" or chunks[0][2] - chunks[0][1] != 13:
        return None
    ihdr = data[chunks[0][1]:chunks[0][2]]
    width, height = int.from_bytes(ihdr[0:4], "big"), int.from_bytes(ihdr[4:8], "big")
    mode = _PNG_MODES.get((ihdr[8], ihdr[9]))
    if mode is None or ihdr[10] or ihdr[11] or ihdr[12] > 1 or not _pillow_opens(width, height):
        return None
    kinds = [kind for kind, _, _ in chunks]
    if b"IDAT" not in kinds:
        return None
    first = kinds.index(b"IDAT")
    last = first
    while kinds[last + 1] == b"IDAT":
        last += 1
    before = _png_extras(data, chunks[1:first], mode[0], 0)
    if before is None:
        return None
    exif, text = before
    if exif is None:  # Pillow decodes the image, then reads the chunks after it, to look for EXIF
        after = _png_extras(data, chunks[last + 1:-1], mode[0], text)
        if after is None or not _pixels_decode(data, chunks[first:last + 1], _rows(width, height, mode[1], ihdr[12])):
            return None
        exif = after[0]
    orientation = orientation_of(None if exif is None else b"Exif\x00\x00" + exif, None)
    return None if orientation is None else (width, height, orientation)


def _png_extras(data: bytes, chunks: Chunks, mode: str, text: int) -> tuple[bytes | None, int] | None:
    """(the last eXIf's data, text bytes so far) of chunks Pillow reads without failing and without
    changing how it reads the rest; None when one is outside that."""
    exif = None
    for kind, start, end in chunks:
        size = end - start
        if kind == b"eXIf":
            exif = data[start:end]
        elif kind in (b"tEXt", b"iTXt"):
            text += size
            if text > _LIMIT or not _plain_text(kind, data[start:end]):
                return None
        elif kind in _UNFOLLOWED or size < _SHORTEST.get(kind, 0):
            return None
        elif kind == b"PLTE" and mode == "P" and not (0 < size <= 768 and size % 3 == 0):
            return None
        elif kind == b"tRNS" and size < _TRNS_SHORTEST.get(mode, 0):
            return None
        elif kind == b"iCCP" and not _profile_fits(data[start:end]):
            return None
    return exif, text


def _plain_text(kind: bytes, s: bytes) -> bool:
    """A text chunk whose key is none of Pillow's own info keys, and an iTXt not compressed."""
    key = s.split(b"\x00", 1)[0]
    if key.decode("latin-1") in _PILLOW_KEYS:
        return False
    rest = s[len(key) + 1:]
    return kind != b"iTXt" or len(rest) < 2 or rest[0] == 0


def _profile_fits(s: bytes) -> bool:
    """Whether Pillow reads an iCCP chunk without failing: a name, compression 0, and a profile that
    inflates to at most 1 MiB (a stream zlib rejects is dropped quietly)."""
    name_end = s.find(b"\x00")
    if name_end < 0 or name_end + 1 >= len(s) or s[name_end + 1] != 0:
        return False
    try:
        inflater = zlib.decompressobj()
        inflater.decompress(s[name_end + 2:], _LIMIT)
        return not inflater.unconsumed_tail
    except zlib.error:
        return True


def _rows(width: int, height: int, bits: int, interlaced: int) -> list[tuple[int, int]]:
    """(bytes per row with its filter byte, rows) of each pass of the pixel data, in stream order."""
    if not interlaced:
        return [((width * bits + 7) // 8 + 1, height)]
    passes = []
    for col, row, col_step, row_step in _ADAM7:
        cols, rows = (width - col + col_step - 1) // col_step, (height - row + row_step - 1) // row_step
        if cols > 0 and rows > 0:
            passes.append(((cols * bits + 7) // 8 + 1, rows))
    return passes


def _pixels_decode(data: bytes, idats: Chunks, rows: list[tuple[int, int]]) -> bool:
    """Whether Pillow's PNG decoder surely gets every row from these IDAT chunks: their zlib stream
    inflates without error to its end, to at least the bytes the rows need, and every row's filter type
    is one of PNG's five. Inflates 1 MiB at a time and gives up a MiB past what the rows need."""
    need = sum(length * count for length, count in rows)
    inflater, done, view = zlib.decompressobj(), 0, memoryview(data)
    pieces = [view[at:min(at + _PIECE, end)] for _, start, end in idats for at in range(start, end, _PIECE)]
    pieces.append(b"")  # drains what zlib holds back
    try:
        for piece in pieces:
            while not inflater.eof:
                out = inflater.decompress(piece, _LIMIT)
                if not _filters_valid(out, done, rows):
                    return False
                done += len(out)
                if done > need + _LIMIT:
                    return False
                piece = inflater.unconsumed_tail
                if not piece and len(out) < _LIMIT:
                    break
    except zlib.error:
        return False
    return inflater.eof and done >= need


def _filters_valid(out: bytes, at: int, rows: list[tuple[int, int]]) -> bool:
    """Whether every row's filter byte that falls in `out` (stream offsets at .. at + len(out)) is 0-4."""
    start, end = 0, at + len(out)
    for length, count in rows:
        stop = start + length * count
        first = start if start >= at else start + -(-(at - start) // length) * length
        if first < min(stop, end) and out[first - at:min(stop, end) - at:length].translate(None, _VALID_FILTERS):
            return False
        start = stop
    return True
