"""Run one fuzz target for a bounded time.

    python -m fuzz.run TARGET [libFuzzer flags, e.g. -max_total_time=60]   coverage-guided (atheris)
    python -m fuzz.run --mutate TARGET SECONDS [SEED]                      plain mutation of the corpus

The corpus lives in build/fuzz-corpus/TARGET (seeded from fixtures/ on the first run, grown by
libFuzzer). An input that breaks a target's oracle (fuzz/targets.py) is saved once per distinct
(exception type, raising line) to build/fuzz-artifacts/TARGET/ and the run goes on, so one bounded
run reports every distinct finding (a `=== FINDING` line in the log; libFuzzer's own exit ends the
process, so fuzz/all.sh counts those lines). A memory error in the
C decoder aborts with AddressSanitizer's report (libFuzzer saves that input as crash-*).

jpeg_region: under atheris it runs the normal build of datapipe/_jpeg_region.c (the canary oracle
catches writes past the buffer; coverage comes from the marker walk of the same bytes). With
--mutate it loads the AddressSanitizer + UBSan build (fuzz/build_asan.sh, into build/fuzz-asan/),
re-executing itself with gcc's libasan preloaded, and mutates the corpus atheris grew. (Under
atheris, gcc's libasan would shadow libFuzzer's coverage callbacks and blind it: see README.md.)
"""
from __future__ import annotations

import faulthandler
import hashlib
import importlib
import importlib.util
import os
import random
import re
import subprocess
import sys
import tempfile
import time
import traceback
import tracemalloc
from pathlib import Path

from fuzz.targets import PARAM_BYTES, ROOT, TARGETS, Target, mutate, run_checked

ASAN_DIR = ROOT / "build" / "fuzz-asan"


def _preload_asan() -> None:
    """Re-exec with libasan/libubsan preloaded (the extension's sanitizer runtime must load first)."""
    if os.environ.get("DATAPIPE_FUZZ_ASAN") == "1":
        return
    libs = [subprocess.check_output(["gcc", f"-print-file-name={n}"], text=True).strip()
            for n in ("libasan.so", "libubsan.so")]
    env = dict(os.environ, DATAPIPE_FUZZ_ASAN="1", LD_PRELOAD=":".join(libs),
               ASAN_OPTIONS="detect_leaks=0:allocator_may_return_null=1:abort_on_error=1",
               UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1")
    os.execve(sys.executable, [sys.executable, "-m", "fuzz.run", *sys.argv[1:]], env)  # no return


def _load_asan_region() -> None:
    import fuzz.targets as targets

    built = subprocess.check_output(["sh", "fuzz/build_asan.sh", str(ASAN_DIR)], cwd=ROOT, text=True).split()[-1]
    spec = importlib.util.spec_from_file_location("_jpeg_region", ROOT / built)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    targets.REGION_EXT = module
    print(f"jpeg_region: AddressSanitizer build {module.__file__}", flush=True)


class Recorder:
    """Counts executions; saves the first input of each distinct finding."""

    def __init__(self, target: Target, folder: Path) -> None:
        self.target, self.folder, self.runs, self.seen = target, folder, 0, {}

    def __call__(self, data: bytes) -> None:
        self.runs += 1
        try:
            run_checked(self.target, data)
        except Exception as exc:  # noqa: BLE001 - every escape is a finding; the run goes on
            frame = traceback.extract_tb(exc.__traceback__)[-1]
            where = f"{Path(frame.filename).name}:{frame.lineno}"
            signature = f"{type(exc).__name__}@{where}"
            if signature in self.seen:
                return
            self.folder.mkdir(parents=True, exist_ok=True)
            name = re.sub(r"[^A-Za-z0-9_.@-]", "_", signature) + "-" + hashlib.sha1(data).hexdigest()[:12]
            (self.folder / name).write_bytes(data)
            self.seen[signature] = name
            print(f"\n=== FINDING {signature}: {type(exc).__name__}: {str(exc)[:300]}\n    saved {self.folder / name}",
                  flush=True)


def _corpus(target: Target) -> Path:
    corpus = ROOT / "build" / "fuzz-corpus" / target.name
    if not corpus.is_dir() or not any(corpus.iterdir()):
        corpus.mkdir(parents=True, exist_ok=True)
        for seed in target.seeds():
            (corpus / hashlib.sha1(seed).hexdigest()).write_bytes(seed)
    return corpus


def mutate_for(target: Target, seconds: float, seed: int) -> None:
    """Replay the corpus, then mutate it (fuzz.targets.mutate) until `seconds` have passed. A hang
    (10 s on one input) ends the process with a traceback; the input is in .current."""
    corpus, artifacts = _corpus(target), ROOT / "build" / "fuzz-artifacts" / target.name
    recorder = Recorder(target, artifacts)
    inputs = [p.read_bytes() for p in sorted(corpus.iterdir()) if p.is_file()]
    inputs += [s for s in target.seeds() if s not in inputs]
    rng, keep, current = random.Random(seed), PARAM_BYTES.get(target.name, 0), artifacts / ".current"
    artifacts.mkdir(parents=True, exist_ok=True)
    end, replay = time.monotonic() + seconds, list(inputs)
    while time.monotonic() < end:
        data = replay.pop() if replay else mutate(rng.choice(inputs), inputs, rng, keep)
        current.write_bytes(data)
        faulthandler.dump_traceback_later(10, exit=True)
        recorder(data)
        faulthandler.cancel_dump_traceback_later()
    print(f"Done {recorder.runs} runs in {seconds:.0f} second(s) ({len(inputs)} corpus inputs replayed first; "
          f"{'AddressSanitizer build' if target.name == 'jpeg_region' else 'plain'}), "
          f"{len(recorder.seen)} distinct findings", flush=True)


def main() -> None:
    args = sys.argv[1:]
    plain = bool(args) and args[0] == "--mutate"
    if plain:
        args = args[1:]
    if not args or args[0] not in TARGETS or (plain and len(args) < 2):
        sys.exit(f"usage: python -m fuzz.run {{{','.join(TARGETS)}}} [libFuzzer flags, e.g. -max_total_time=60]\n"
                 f"       python -m fuzz.run --mutate TARGET SECONDS [SEED]")
    name, flags, target = args[0], args[1:], TARGETS[args[0]]
    scratch = ROOT / "build" / "fuzz-tmp"  # libFuzzer ends the process with _exit: no atexit cleanup; all.sh empties it
    scratch.mkdir(parents=True, exist_ok=True)
    tempfile.tempdir = str(scratch)
    if target.memory is not None:
        tracemalloc.start()
    if plain:
        if name == "jpeg_region":
            _preload_asan()
            _load_asan_region()
        mutate_for(target, float(args[1]), int(args[2]) if len(args) > 2 else 0)
        return
    import atheris

    with atheris.instrument_imports(include=list(target.instrument)):
        for module in target.instrument:
            importlib.import_module(module)
    corpus = _corpus(target)
    artifacts = ROOT / "build" / "fuzz-artifacts" / name
    artifacts.mkdir(parents=True, exist_ok=True)
    recorder = Recorder(target, artifacts)
    guide = target.guide
    one = recorder if guide is None else (lambda data: (guide(data), recorder(data)))
    defaults = ["-timeout=10", "-rss_limit_mb=3072", "-max_len=65536", f"-artifact_prefix={artifacts}/"]
    atheris.Setup([sys.argv[0], *defaults, *flags, str(corpus)], one)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
