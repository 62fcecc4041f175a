"""A JPEG's marker structure without its entropy-coded data, for validation at a fraction of a decode.

libjpeg (and so Pillow, which the converters' `--validate decode` asks) never fails on the contents
of a scan's entropy-coded data: a bad Huffman code, a scan that ends early or runs long are warnings,
answered with zeros. Whether an image is accepted depends only on its marker segments (tables,
frame, scan headers, restart markers, and where each scan ends), which libjpeg finds by looking for
0xFF followed by a byte other than 0x00. The one exception: the DC-first scans of a progressive
JPEG, where libjpeg-turbo >= 2.0 stops on a DC sum that overflows; those scans are kept whole.

`skeleton(data)` keeps every marker segment as it is, every restart marker, and the progressive
DC-first scans, and drops the rest of the entropy-coded bytes (~99% of a photo's bytes). Decoding the
skeleton gives the verdict decoding the original gives, tested on mutated streams
(tests/test_jpeg_markers.py). It answers None when the stream is anything but a clean Huffman-coded
JPEG (no SOI, bytes between segments, a segment or scan running past the end, no EOI, arithmetic or
lossless coding): the caller then decodes the original.
"""
from __future__ import annotations

import re

_MARKER = re.compile(rb"\xff[^\x00\xff]")  # fill bytes (FF FF ...) end at the marker's own FF; a literal
# prefix, so the search runs at C speed
_SOF_PROGRESSIVE = {0xC0: False, 0xC1: False, 0xC2: True}  # Huffman-coded DCT frames
_OTHER_SOF = frozenset(range(0xC3, 0xD0)) - {0xC4, 0xC8, 0xCC}  # lossless or arithmetic frames
_STANDALONE = frozenset(range(0xD0, 0xDA)) | {0x01}  # RSTn, SOI, EOI, TEM: no length field
_SOS, _EOI = 0xDA, 0xD9


def _next_marker(data: bytes, pos: int) -> int:
    """Offset of the 0xFF that starts the next marker at or after `pos` (after any fill bytes), or -1."""
    found = _MARKER.search(data, pos)
    return -1 if found is None else found.start()


def _dc_first(sos: bytes) -> bool:
    """Whether an SOS segment (marker included) starts a progressive DC scan: Ss == 0 and Ah == 0."""
    return len(sos) >= 7 and sos[-3] == 0 and sos[-1] >> 4 == 0


def skeleton(data: bytes) -> bytes | None:
    """The stream with the entropy-coded bytes dropped (see the module docstring), or None."""
    if len(data) < 4 or not data.startswith(b"\xff\xd8"):
        return None
    kept, pos, progressive = [b"\xff\xd8"], 2, None
    while True:
        if pos + 2 > len(data) or data[pos] != 0xFF or data[pos + 1] in (0x00, 0xFF):
            return None  # bytes between segments (libjpeg skips them with a warning): decode the original
        marker = data[pos + 1]
        if marker == _EOI:
            kept.append(b"\xff\xd9")
            return b"".join(kept)
        if marker in _STANDALONE:
            kept.append(data[pos:pos + 2])
            pos += 2
            continue
        end = pos + 2 + int.from_bytes(data[pos + 2:pos + 4], "big")
        if pos + 4 > len(data) or end > len(data):
            return None
        kept.append(data[pos:end])
        if marker in _OTHER_SOF or (marker in _SOF_PROGRESSIVE and progressive is not None):
            return None
        progressive = _SOF_PROGRESSIVE.get(marker, progressive)
        pos = end
        if marker != _SOS:
            continue
        if progressive is None:
            return None
        pos = _pass_scan(data, pos, kept, keep_data=progressive and _dc_first(kept[-1]))
        if pos < 0:
            return None


def _pass_scan(data: bytes, pos: int, kept: list[bytes], keep_data: bool) -> int:
    """Walk a scan's entropy-coded data from `pos` to its first marker other than a restart marker,
    appending the restart markers (and the data too when `keep_data`) to `kept`; returns the offset of
    that marker, or -1 when the stream ends first."""
    while True:
        at = _next_marker(data, pos)
        if at < 0:
            return -1
        if keep_data:
            kept.append(data[pos:at])
        if not 0xD0 <= data[at + 1] <= 0xD7:
            return at
        kept.append(data[at:at + 2])
        pos = at + 2
