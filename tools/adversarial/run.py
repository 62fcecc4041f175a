"""Run adversarial case files and print what held: python tools/adversarial/run.py CASEFILE... [-k TEXT] [--json OUT]

Exit 1 when any case broke (a hang, a traceback, a leaked secret, ...); the table says which and why."""
from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.adversarial.harness import Case, Outcome, run_case  # noqa: E402


def load_cases(path: Path) -> list[Case]:
    spec = importlib.util.spec_from_file_location(f"adversarial_cases_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    cases = getattr(module, "CASES", None)
    if not isinstance(cases, list) or not all(isinstance(c, Case) for c in cases):
        raise SystemExit(f"{path}: define CASES, a list of tools.adversarial.harness.Case")
    return cases


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("-k", default="", help="run only the cases whose name contains this text")
    parser.add_argument("--json", type=Path, help="write every outcome here")
    args = parser.parse_args(argv)
    outcomes: list[Outcome] = []
    for path in args.files:
        for case in load_cases(path):
            if args.k in case.name:
                outcome = run_case(case)
                outcomes.append(outcome)
                print(f"{'ok ' if outcome.held else 'BAD'} {outcome.verdict:12} {outcome.seconds:7.1f}s "
                      f"{outcome.peak_mb:7.0f}MB rc={outcome.rc}  {outcome.name}\n        {outcome.last_line}", flush=True)
    broken = [o for o in outcomes if not o.held]
    print(f"{len(outcomes) - len(broken)} of {len(outcomes)} held" + (f"; broke: {', '.join(o.name for o in broken)}"
                                                                    if broken else ""))
    if args.json:
        args.json.write_text(json.dumps([asdict(o) for o in outcomes], indent=1))
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
