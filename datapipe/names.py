"""The one rule for a name a dataset supplies: a plain relative name inside the dataset.

A dataset may come from a stranger, so every name it gives (a manifest's shard, index and split names,
a tar member's name used as a key) is checked before it becomes part of a path or a key: no `..`,
not absolute, no empty or `.` part, no NUL or control character, no backslash, bounded length. Names
turned into files of the shard cache are also hashed unless they are plain (`cache_component`).
Kept free of imports from the rest of datapipe, so any module may use it.
"""
from __future__ import annotations

import hashlib
import re

MAX_NAME = 1024  # characters in a whole name
MAX_PART = 255  # characters in one `/`-separated part (a file name on most filesystems)
_PLAIN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")  # used verbatim as a file name in the cache
_HEX64 = re.compile(r"[0-9a-f]{64}")


class UnsafeName(ValueError):
    """A dataset supplied a name that could point outside it; the dataset is damaged or was crafted."""


def _flaw(name: object) -> str | None:
    """Why `name` is not a plain relative name, or None."""
    if not isinstance(name, str) or not name:
        return "it is not a non-empty string"
    if len(name) > MAX_NAME:
        return f"it is longer than {MAX_NAME} characters"
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        return "it holds a NUL or control character"
    if "\\" in name:
        return "it holds a backslash"
    if name.startswith("/"):
        return "it is absolute"
    parts = name.split("/")
    if ".." in parts:
        return "it climbs out with '..'"
    if any(p in ("", ".") for p in parts):
        return "it has an empty or '.' part"
    if any(len(p) > MAX_PART for p in parts):
        return f"a part of it is longer than {MAX_PART} characters"
    return None


def check_name(name: object, field: str) -> str:
    """`name` if it is a plain relative name inside the dataset, else an UnsafeName naming `field`."""
    flaw = _flaw(name)
    if flaw:
        shown = repr(name) if len(repr(name)) <= 80 else repr(name)[:77] + "..."
        raise UnsafeName(f"{field} {shown} is not a plain relative name inside the dataset ({flaw}); "
                         "the dataset is damaged or was crafted: do not open it")
    return name  # type: ignore[return-value]


def check_digest(digest: object, field: str) -> str:
    """A sha256 hex digest as a manifest stores it, else an UnsafeName naming `field`."""
    if not isinstance(digest, str) or not _HEX64.fullmatch(digest):
        raise UnsafeName(f"{field} {str(digest)[:80]!r} is not a sha256 hex digest; the dataset is damaged or was "
                         "crafted: do not open it")
    return digest


def cache_component(text: str) -> str:
    """One file-name part for `text`: itself when plain (letters, digits, `._-`, no leading dot), else
    `%` and a sha256 of it (`%` is never in a plain name, so the two kinds never collide)."""
    if _PLAIN.fullmatch(text):
        return text
    return "%" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]
