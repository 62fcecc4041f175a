"""A small reader of MATLAB v5 `.mat` files: what ImageNet's devkit `meta.mat` holds, nothing more.

`meta.mat` is a struct array `synsets` (1860 x 1) whose fields are char arrays (WNID, words, gloss)
and doubles (ILSVRC2012_ID, num_children, children, ...). MATLAB may write any element compressed
(miCOMPRESSED: a zlib stream holding the element) and stores doubles in the smallest integer type
that holds them (a double 7 as one miUINT8 byte); scipy's `savemat` writes them plainly. Both are read.

Read: numeric arrays (real), char arrays, struct arrays and cell arrays. Refused with a ValueError:
sparse, complex, object and function-handle arrays, and MAT 7.3 (an HDF5 file). The file comes from
a download, so nothing it claims is trusted: sizes must fit in the data, compressed elements inflate
to at most `MAX_INFLATED` bytes in all, nesting is at most `MAX_DEPTH` deep. A value comes back
flattened in MATLAB's (column-major) order, without its dimensions: numbers as a list of floats or
ints, text as a str (a list of row strings for a multi-row char array), a struct array as a list of
{field: value} dicts, a cell array as a list of values, an empty element as None.
"""
from __future__ import annotations

import math
import zlib
from typing import Any

import numpy as np

HEADER = 128
MAX_INFLATED = 256 << 20
MAX_DEPTH = 32
MI_INT8, MI_UINT32, MI_INT32, MI_MATRIX, MI_COMPRESSED = 1, 6, 5, 14, 15
_NUMERIC = {1: "i1", 2: "u1", 3: "i2", 4: "u2", 5: "i4", 6: "u4", 7: "f4", 9: "f8", 12: "i8", 13: "u8"}
_TEXT = {1: "latin-1", 2: "latin-1", 4: "utf-16", 16: "utf-8", 17: "utf-16", 18: "utf-32"}
MX_CELL, MX_STRUCT, MX_CHAR = 1, 2, 4
_MX_NUMERIC = range(6, 16)
_MX_NAMES = {3: "an object", 5: "a sparse array", 16: "a function handle", 17: "an opaque object"}
_COMPLEX = 0x0800


class MatFile:
    """A parse of one file's bytes: `variables()` reads its top-level elements."""

    def __init__(self, blob: bytes, where: str) -> None:
        self.where, self.inflated = where, 0
        if len(blob) < HEADER:
            raise self.error(f"is {len(blob)} bytes, shorter than a MAT file's {HEADER}-byte header")
        if blob[:HEADER].startswith(b"MATLAB 7.3") or blob[:8] == b"\x89HDF\r\n\x1a\n":
            raise self.error("is a MATLAB 7.3 (HDF5) file; this reader reads MAT v5 files (save it with -v7)")
        marker = blob[126:128]
        if marker not in (b"IM", b"MI") or blob[124:126] not in (b"\x00\x01", b"\x01\x00"):
            raise self.error("is not a MATLAB v5 .mat file (no version and endian marker at byte 124)")
        self.order = "<" if marker == b"IM" else ">"
        self.blob = blob

    def error(self, what: str) -> ValueError:
        return ValueError(f"{self.where} {what}; re-download it")

    def variables(self) -> dict[str, Any]:
        """Every top-level variable: name -> value."""
        out, pos = {}, HEADER
        while pos + 8 <= len(self.blob):
            kind, data, pos = self._element(self.blob, pos)
            if kind == MI_COMPRESSED:
                kind, data = self._inflate(data)
            if kind == MI_MATRIX:
                name, value = self._matrix(data, 0)
                out[name] = value
        return out

    def _element(self, buf: bytes, pos: int) -> tuple[int, bytes, int]:
        """(type, data, next position) of the element at `pos`: a small element (data packed in the
        tag) or a tag and its data, padded to 8 bytes (a compressed element is not padded)."""
        if pos + 8 > len(buf):
            raise self.error(f"ends inside an element tag at byte {pos}")
        word = int.from_bytes(buf[pos:pos + 4], "little" if self.order == "<" else "big")
        if word >> 16:  # small data element: 2 bytes size, 2 bytes type, 4 bytes data
            size, kind = word >> 16, word & 0xFFFF
            if size > 4:
                raise self.error(f"has a small element of {size} bytes at byte {pos} (at most 4)")
            return kind, buf[pos + 4:pos + 4 + size], pos + 8
        kind = word
        size = int.from_bytes(buf[pos + 4:pos + 8], "little" if self.order == "<" else "big")
        end = pos + 8 + size
        if end > len(buf):
            raise self.error(f"has an element at byte {pos} claiming {size} bytes past the end of its data")
        step = size if kind == MI_COMPRESSED else size + (-size % 8)
        return kind, buf[pos + 8:end], pos + 8 + step

    def _inflate(self, data: bytes) -> tuple[int, bytes]:
        """The element inside a miCOMPRESSED one, inflated within what is left of MAX_INFLATED."""
        room = MAX_INFLATED - self.inflated
        try:
            inflator = zlib.decompressobj()
            inner = inflator.decompress(data, room + 1)
        except zlib.error as exc:
            raise self.error(f"has a compressed element that does not inflate ({exc})") from None
        if len(inner) > room:
            raise self.error(f"inflates to more than {MAX_INFLATED >> 20} MiB; not a metadata file")
        self.inflated += len(inner)
        kind, body, _ = self._element(inner, 0)
        return kind, body

    def _matrix(self, data: bytes, depth: int) -> tuple[str, Any]:
        """(name, value) of a miMATRIX element's data."""
        if depth > MAX_DEPTH:
            raise self.error(f"nests arrays more than {MAX_DEPTH} deep")
        if not data:
            return "", None  # MATLAB writes an empty field or cell as a bare tag
        kind, flags, pos = self._element(data, 0)
        kind2, dims_raw, pos = self._element(data, pos)
        kind3, name, pos = self._element(data, pos)
        if kind != MI_UINT32 or len(flags) != 8 or kind2 != MI_INT32 or kind3 != MI_INT8:
            raise self.error("has an array without its flags, dimensions and name")
        head = self._numbers(MI_UINT32, flags)[0]
        dims = self._numbers(MI_INT32, dims_raw)
        if any(d < 0 for d in dims):
            raise self.error(f"has an array of negative dimensions {dims}")
        mx, count = head & 0xFF, math.prod(dims)
        if head & _COMPLEX:
            raise self.error("holds a complex array, which this reader does not read")
        if mx == MX_STRUCT:
            return name.decode("latin-1"), self._struct(data, pos, count, depth)
        if mx == MX_CELL:
            cells = [self._child(data, start, depth)[0] for start in self._children(data, pos, count)]
            return name.decode("latin-1"), cells
        kind, body, _ = self._element(data, pos)
        if mx == MX_CHAR:
            return name.decode("latin-1"), self._text(kind, body, dims)
        if mx in _MX_NUMERIC:
            return name.decode("latin-1"), self._numbers(kind, body)
        raise self.error(f"holds {_MX_NAMES.get(mx, f'an array of class {mx}')}, which this reader does not read")

    def _children(self, data: bytes, pos: int, count: int) -> list[int]:
        """The start positions of `count` consecutive elements from `pos`."""
        starts = []
        for _ in range(count):
            starts.append(pos)
            _, _, pos = self._element(data, pos)
        return starts

    def _child(self, data: bytes, pos: int, depth: int) -> tuple[Any, int]:
        kind, body, after = self._element(data, pos)
        if kind != MI_MATRIX:
            raise self.error(f"has a type-{kind} element where an array belongs")
        return self._matrix(body, depth + 1)[1], after

    def _struct(self, data: bytes, pos: int, count: int, depth: int) -> list[dict[str, Any]]:
        """A struct array: the field name length, the names, then each element's fields in order."""
        kind, raw, pos = self._element(data, pos)
        kind2, names, pos = self._element(data, pos)
        width = self._numbers(MI_INT32, raw)[0] if kind == MI_INT32 and len(raw) == 4 else 0
        if width <= 0 or kind2 != MI_INT8 or len(names) % width:
            raise self.error("has a struct array without a valid field name table")
        fields = [names[i:i + width].split(b"\0", 1)[0].decode("latin-1") for i in range(0, len(names), width)]
        out = []
        for _ in range(count):
            element = {}
            for field in fields:
                element[field], pos = self._child(data, pos, depth)
            out.append(element)
        return out

    def _numbers(self, kind: int, body: bytes) -> list[Any]:
        code = _NUMERIC.get(kind)
        if code is None or len(body) % int(code[1]):
            raise self.error(f"has numeric data of type {kind} and {len(body)} bytes, which do not fit")
        return np.frombuffer(body, dtype=self.order + code).tolist()

    def _text(self, kind: int, body: bytes, dims: list[int]) -> str | list[str]:
        encoding = _TEXT.get(kind)
        if encoding is None:
            raise self.error(f"has text stored as type {kind}, which this reader does not read")
        if encoding in ("utf-16", "utf-32"):
            encoding += "-le" if self.order == "<" else "-be"
        try:
            text = body.decode(encoding)
        except UnicodeDecodeError as exc:
            raise self.error(f"has text that is not {encoding} ({exc.reason})") from None
        rows = dims[0] if len(dims) == 2 else 1
        if rows <= 1 or len(text) % rows:
            return text
        return ["".join(text[r::rows]) for r in range(rows)]  # column-major: row r is every rows-th char


def read_mat(blob: bytes, *, where: str = "the .mat file") -> dict[str, Any]:
    """The top-level variables of a MAT v5 file's bytes (`where` names it in errors)."""
    return MatFile(blob, where).variables()
