"""Shard patterns counted before they are expanded, then made one name at a time (issue #38 row 8): the
names and their order are braceexpand's, for its ranges, alternatives, escapes and nesting."""
from __future__ import annotations

import itertools
import random
import tracemalloc

import pytest
from braceexpand import braceexpand

from datapipe.formats.braces import MAX_SHARDS, shard_names

pytestmark = pytest.mark.forked  # tracemalloc in a child with one thread (tests/forked.py)

CASES = ["a", "", "{}", "{a}", "{1..3}", "x{00..10}y", "{a..g..2}", "{Z..a}", "{4..1}", "{2..-1}", "{1..10..3}",
         "{1..10..0}", "python{2.{5..7},3.{2,3}}", r"{1\{2,3}", "index.html{,.backup}", "{a,b}{c,d}{e,{f,g}}",
         "a}b{c", "{{a,b}}", "{{1..3}}", "{,}", "{a,{b}}", "{-05..5}", "{a..c..-2}", "{z..a}", r"a\,b{x\,y,z}\\",
         r"{1\\Z,.b2,}z2", "shards/train-{000000..000099}.tar"]


def expanded(pattern: str) -> tuple[int, list[str]] | str:
    try:
        count, names = shard_names(pattern)
    except ValueError as exc:
        return "unbalanced" if "unbalanced braces" in str(exc) else str(exc)
    return count, list(names)


def braceexpanded(pattern: str) -> tuple[int, list[str]] | str:
    try:
        names = list(braceexpand(pattern))
    except ValueError:
        return "unbalanced"
    return len(names), names


@pytest.mark.parametrize("pattern", CASES)
def test_the_count_and_the_names_are_braceexpands(pattern):
    assert expanded(pattern) == braceexpanded(pattern)


def test_random_patterns_count_and_expand_as_braceexpand_does():
    draw = random.Random(38)
    for _ in range(3000):
        pattern = "".join(draw.choice("{},.\\ab12-0zZ") for _ in range(draw.randint(0, 14)))
        assert expanded(pattern) == braceexpanded(pattern), pattern


def test_names_are_made_one_at_a_time_and_a_range_is_never_held():
    tracemalloc.start()
    try:
        count, names = shard_names(f"s-{{000..999}}-{{0..{MAX_SHARDS // 1000 - 1}}}.tar")
        first = list(itertools.islice(names, 3))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert count == MAX_SHARDS and first == ["s-000-0.tar", "s-000-1.tar", "s-000-2.tar"]
    assert peak < 1 << 20, peak  # braceexpand holds each range it multiplies: tens of MB here
