"""What every fuzz target shares: the repository's paths, the CPU bound of one input, the `Finding`
a broken contract raises and the `Target` record (fuzz/targets.py assembles them; the larger targets
live in a module each, as fuzz/parquet_target.py and fuzz/sidecars_target.py)."""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
CPU_SECONDS = 1.0  # a hang: more CPU time than this on one input (CPU, not wall: the cores are shared)


class Finding(AssertionError):
    """A broken contract that raised nothing: a hang, an allocation past the bound, a wrong answer."""


@dataclass(frozen=True)
class Target:
    name: str
    check: Callable[[bytes], None]
    seeds: Callable[[], list[bytes]]
    instrument: tuple[str, ...]  # the modules atheris instruments for coverage
    memory: tuple[int, int] | None = None  # (per input byte, constant): tracemalloc peak bound
    guide: Callable[[bytes], object] | None = None  # pure Python run first, for coverage feedback only


def timed(name: str, start: float) -> None:
    """A Finding when more than CPU_SECONDS of CPU went by since `start` (time.process_time)."""
    spent = time.process_time() - start
    if spent > CPU_SECONDS:
        raise Finding(f"{name}: {spent:.2f} s of CPU on one input (a hang)")
