"""A record's caption and JSON metadata from the bytes that hold them: one parser for an image folder's
sidecars (datapipe.formats.scan), other tools' shards converted (converters.tar_shards) and read in place
(datapipe.formats.wds_foreign), so the three accept and refuse the same bytes with the same words.

A bad one is a one-line ValueError naming `where` (the file or member, as the caller shows it) and
the reason, never another exception: a sample is skipped with it at convert, a record read in place
fails with it (the loader's on_error policy serves around it).
"""
from __future__ import annotations

import json
import sys

from ..records import canonical_meta

_JSON_TYPES = {list: "array", str: "string", int: "number", float: "number", bool: "boolean",
               type(None): "null"}


def _utf8(raw: bytes, where: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{where} is not UTF-8 text (byte {exc.start}); write it as UTF-8") from None


def caption(raw: bytes, where: str, *, strip_newline: bool) -> str:
    """A caption's text: UTF-8, kept exactly, but with `strip_newline` one trailing "\\n" or "\\r\\n"
    dropped (a person's editor adds it to a sidecar file; a program's tar member is kept as written)."""
    text = _utf8(raw, where)
    if strip_newline:
        return text[:-2] if text.endswith("\r\n") else text[:-1] if text.endswith("\n") else text
    return text


def metadata(raw: bytes, where: str) -> str:
    """JSON metadata as stored (records.canonical_meta): UTF-8 text holding one JSON object."""
    text = _utf8(raw, where)
    try:
        body = json.loads(text)
        if isinstance(body, dict):
            return canonical_meta(body)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where} is not valid JSON ({exc}); fix or remove it") from None
    except RecursionError:  # "[[[[..." past the interpreter's limit: json raises this, not a ValueError
        raise ValueError(f"{where} is JSON nested too deep to read (past {sys.getrecursionlimit()} levels); "
                         "flatten or remove it") from None
    except ValueError as exc:  # anything else json refuses: an integer past int's digit limit, ...
        raise ValueError(f"{where} cannot be read as JSON ({exc}); fix or remove it") from None
    raise ValueError(f"{where} is not a JSON object (it holds a JSON {_JSON_TYPES[type(body)]}); metadata must "
                     'be an object, e.g. {"tags": [...]}')
