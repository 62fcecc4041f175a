"""What each self-test check found, and how it is shown: a table, a JSON document, an exit status."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

STATUSES = ("pass", "fail", "warn", "skip", "info")
MARKS = {"pass": "pass", "fail": "FAIL", "warn": "WARN", "skip": "skip", "info": "info"}


@dataclass
class Result:
    """One check: its status, the figure it measured (for people), why (a hint where it failed), and
    the numbers behind the figure (for --json)."""

    check: str
    status: str
    figure: str = ""
    detail: str = ""
    values: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {self.status!r}")


def failed(check: str, exc: BaseException) -> Result:
    """A check that raised: a failure naming the error (the GPU path did not run as it should)."""
    text = str(exc).strip().splitlines()
    return Result(check, "fail", "error", f"{type(exc).__name__}: {text[-1] if text else ''}"[:300])


def exit_status(results: Sequence[Result]) -> int:
    """1 when any check failed (a GPU path disagreed with the CPU path, or did not run), else 0.
    Warnings (slow, or a feature not available here) do not fail the test."""
    return 1 if any(r.status == "fail" for r in results) else 0


def table(results: Sequence[Result], header: str = "") -> str:
    """A fixed-width table: status, check, figure; the detail on a line below where there is one."""
    width = max([len(r.check) for r in results] + [5])
    lines = [header] if header else []
    lines.append(f"{'':4}  {'check':{width}}  figure")
    for r in results:
        lines.append(f"{MARKS[r.status]:4}  {r.check:{width}}  {r.figure}")
        if r.detail:
            lines.append(f"{'':4}  {'':{width}}  -> {r.detail}")
    passed = sum(r.status == "pass" for r in results)
    bad = sum(r.status == "fail" for r in results)
    lines.append(f"{passed} passed, {bad} failed, {len(results) - passed - bad} other")
    return "\n".join(lines)


def document(results: Sequence[Result], machine: dict[str, Any]) -> dict[str, Any]:
    """The --json form: every result, the machine, and the exit status the command returns."""
    return {"results": [asdict(r) for r in results], "machine": machine, "exit_status": exit_status(results)}
