"""The EXIF orientation of an image, read from its EXIF and XMP bytes as Pillow 13's `Image.getexif`
reads them, in pure Python: IFD0 of the TIFF structure (either byte order), tag 0x0112, else XMP's
tiff:Orientation. datapipe.image.headers finds those bytes in a JPEG's or PNG's header.

The bytes are untrusted: every offset is checked against the blob before it is read, nothing is
allocated by a size it claims, and the walk is bounded by its length (docs/security.md).
"""
from __future__ import annotations

import re

EXIF_ORIENTATION = 0x0112
_XMP_ORIENTATION = re.compile(rb'tiff:Orientation(="|>)([0-9])')  # Image.getexif's pattern
_TIFF_UNIT = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 1, 7: 1, 8: 2, 9: 4, 10: 8, 11: 4, 12: 8, 13: 4, 16: 8}
_SHORT, _RATIONAL = 3, 5


def orientation_of(exif: bytes | None, xmp: bytes | None) -> int | None:
    """The orientation Image.getexif gives (IFD0's 0x0112, else XMP's tiff:Orientation, else 1; 0 is 1),
    or None where the reader does not follow Pillow: a non-SHORT orientation, or resolution tags of
    other types than the standard ones (Pillow's JPEG reader may fail on those at open)."""
    tags, order = ifd0(exif) if exif is not None else ({}, "big")
    if tags is None:
        return None
    if tags.get(0x011A, (_RATIONAL,))[0] != _RATIONAL or tags.get(0x0128, (_SHORT,))[0] != _SHORT:
        return None
    if EXIF_ORIENTATION in tags:
        kind, value = tags[EXIF_ORIENTATION]
        return (int.from_bytes(value[:2], order) or 1) if kind == _SHORT else None
    found = _XMP_ORIENTATION.search(xmp) if xmp is not None else None
    return (int(found[2]) or 1) if found else 1


def ifd0(blob: bytes) -> tuple[dict[int, tuple[int, bytes]] | None, str]:
    """IFD0 of an EXIF blob as Pillow loads it: tag -> (type, value bytes), the first of a repeated
    tag, unknown types and empty values left out, values past the blob ending the walk; and the byte
    order. None for a blob Pillow does not read as a plain TIFF header."""
    for _ in range(2):  # Pillow strips "Exif\0\0" once or twice
        if blob.startswith(b"Exif\x00\x00"):
            blob = blob[6:]
    if not blob:
        return {}, "big"
    order = {b"II*\x00": "little", b"MM\x00*": "big"}.get(blob[:4])
    if order is None or len(blob) < 8:
        return None, "big"
    at = int.from_bytes(blob[4:8], order)
    tags: dict[int, tuple[int, bytes]] = {}
    if at + 2 > len(blob):
        return tags, order
    pos, total = at + 2, 0
    for _ in range(int.from_bytes(blob[at:at + 2], order)):
        if pos + 12 > len(blob):
            break
        tag, kind = int.from_bytes(blob[pos:pos + 2], order), int.from_bytes(blob[pos + 2:pos + 4], order)
        size = int.from_bytes(blob[pos + 4:pos + 8], order) * _TIFF_UNIT.get(kind, 0)
        field, pos = blob[pos + 8:pos + 12], pos + 12
        if tag in tags or kind not in _TIFF_UNIT:
            continue
        if size > 4:
            total += size
            if total > len(blob):  # Pillow skips values that cannot fit in the blob
                continue
            start = int.from_bytes(field, order)
            if start + size > len(blob):  # Pillow's read fails and it stops
                break
            field = blob[start:start + size]
        if field[:size]:
            tags[tag] = (kind, field[:size])
    return tags, order
