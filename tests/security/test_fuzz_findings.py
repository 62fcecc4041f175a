"""Inputs the fuzzers found (fuzz/findings/), one regression test each: an .idx line without a
space or with an offset past int64, a manifest shard without 'samples', with 'bytes' past int64 or
sizing a terabyte read of its last sample, 'skipped' that is not a list. Each escaped as IndexError,
OverflowError, KeyError, MemoryError or TypeError; each is now a one-line ValueError."""
from __future__ import annotations

import tracemalloc

import pytest

from fuzz.targets import ROOT, TARGETS, run_checked

pytestmark = pytest.mark.forked  # tracemalloc in a child with one thread (tests/forked.py)

FINDINGS = ROOT / "fuzz" / "findings"


def cases():
    for path in sorted(p for p in FINDINGS.glob("*/*") if p.is_file()):
        rel = path.relative_to(FINDINGS).as_posix()
        yield pytest.param(rel, id=rel)


@pytest.mark.parametrize("rel", list(cases()))
def test_finding_breaks_no_oracle(rel):
    target = TARGETS[rel.split("/", 1)[0]]
    tracemalloc.start()
    try:
        run_checked(target, (FINDINGS / rel).read_bytes())
    finally:
        tracemalloc.stop()
