"""Brace patterns of shard names (`train-{000000..000009}.tar`, several joined by '::'), counted from
their text before any name is made, then expanded one name at a time. `braceexpand` builds the
names of each range it multiplies in full (itertools.product holds its inputs), so
`{0..999999999999}` ran out of memory after a minute before this refused it, and a million names
held 60 MB before the first was looked at.

The parse is braceexpand's own (its range expressions, alternatives, escapes and nesting, and its
range and letter functions), so the names and their order are those `braceexpand` gives; tests
compare the two.
"""
from __future__ import annotations

import itertools
import math
import re
from typing import Callable, Iterator

from braceexpand import UnbalancedBracesError, char_range_re, int_range_re, make_char_range, make_int_range

from ..errors import first_line, quoted, shortened

# The most shards one pattern may name. The project's largest target is ~400,000 shards (LAION-scale,
# docs/clusters.md: 100 TB in shards of 256 MiB); the cap leaves 2.5x room above it and keeps the list
# of names (about 100 bytes each) and a stat of each under 100 MB and a minute.
MAX_SHARDS = 1_000_000
_ESCAPE = re.compile(r"\\(.)")

Names = Callable[[], Iterator[str]]  # a part of a pattern: a fresh iterator over its expansions, each call
Part = tuple[int, Names]  # (how many names, the names)


def shard_names(pattern: str) -> tuple[int, Iterator[str]]:
    """How many names `pattern` ('::'-joined brace patterns) expands to, and those names, made one
    at a time; a one-line ValueError naming the pattern when they are more than MAX_SHARDS or the
    pattern cannot be expanded (nothing is expanded before it)."""
    try:
        parts = [parse(part) for part in pattern.split("::")]
    except UnbalancedBracesError:
        raise ValueError(f"shard pattern {quoted(pattern, 200)} has unbalanced braces") from None
    except (ValueError, RecursionError) as exc:  # a range bound past int()'s 4,300 digits; braces nested too deep
        raise ValueError(f"shard pattern {quoted(pattern, 200)} cannot be expanded ({type(exc).__name__}: "
                         f"{shortened(first_line(exc))})") from None
    count = sum(size for size, _ in parts)
    if count > MAX_SHARDS:
        raise ValueError(f"shard pattern {quoted(pattern, 200)} names {spelled(count)} shards, more than the "
                         f"{MAX_SHARDS:,} one pattern may name (datapipe.formats.braces.MAX_SHARDS); check its "
                         "ranges, or read the shards' folder")
    return count, (name for _, names in parts for name in names())


def spelled(count: int) -> str:
    """A count as a message gives it: with thousands separators, or its power of ten when huge."""
    return f"{count:,}" if count < 10 ** 18 else f"about 10^{int(count.bit_length() * math.log10(2))}"


def parse(pattern: str) -> Part:
    """A pattern (braceexpand's parse_pattern): the product of its literal text and its top-level
    brace expressions, their sizes multiplied (never listed)."""
    items: list[Part] = []
    start, depth, pos = 0, 0, 0
    while pos < len(pattern):
        char = pattern[pos]
        if char == "\\":
            pos += 2
            continue
        if char == "{":
            if depth == 0 and pos > start:
                items.append(literal(pattern[start:pos]))
                start = pos
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                items.append(expression(pattern[start + 1:pos]))
                start = pos + 1
        pos += 1
    if depth != 0:
        raise UnbalancedBracesError(f"Unbalanced braces: {pattern[:80]!r}")
    if start < pos:
        items.append(literal(pattern[start:]))
    size, names = math.prod(part[0] for part in items), [part[1] for part in items]
    if "\\" not in pattern:
        return size, lambda: product(names)
    # braceexpand takes the escapes out of each nested pattern's names, then again at each level above
    return size, lambda: (_ESCAPE.sub(r"\1", name) for name in product(names))


def literal(text: str) -> Part:
    return 1, lambda: iter((text,))


def expression(expr: str) -> Part:
    """One brace expression (braceexpand's parse_expression): an integer range `a..b..step`
    (counted, not listed), a letter range, alternatives `x,y` (their sizes summed), else the braces
    kept around the expanded text."""
    match = int_range_re.match(expr)
    if match:
        bounds = match.groups()
        first, last, step = bounds
        size = abs(int(last) - int(first)) // ((int(step) or 1) if step else 1) + 1
        return size, lambda: make_int_range(*bounds)
    match = char_range_re.match(expr)
    if match:
        letters = make_char_range(*match.groups())  # at most 52
        return len(letters), lambda: iter(letters)
    alternatives = split_alternatives(expr)
    if alternatives is None:
        inner = parse(expr)
        return inner[0], lambda: product([literal("{")[1], inner[1], literal("}")[1]])
    parts = [parse(a) for a in alternatives]
    return sum(size for size, _ in parts), lambda: itertools.chain.from_iterable(names() for _, names in parts)


def split_alternatives(expr: str) -> list[str] | None:
    """`expr` split at its top-level commas (braceexpand's parse_sequence), or None when it has none
    or its braces do not balance (it is then no sequence)."""
    parts, start, depth, pos = [], 0, 0, 0
    while pos < len(expr):
        char = expr[pos]
        if char == "\\":
            pos += 2
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(expr[start:pos])
            start = pos + 1
        pos += 1
    if depth != 0 or not parts:
        return None
    return parts + [expr[start:]]


def product(items: list[Names]) -> Iterator[str]:
    """Every concatenation of one name from each item, in order (the last varying fastest), each
    item's names made again for each prefix instead of held (itertools.product holds them all)."""
    if not items:
        yield ""
        return
    stack, parts = [items[0]()], []  # len(parts) == len(stack) - 1: the prefix of the names below
    while stack:
        name = next(stack[-1], None)
        if name is None:
            stack.pop()
            if parts:
                parts.pop()
        elif len(stack) == len(items):
            yield "".join(parts) + name
        else:
            parts.append(name)
            stack.append(items[len(stack)]())
