"""The adversarial harness: run a surface's hostile and careless inputs, each in its own process under a
timeout and an address-space cap with fake secrets in its environment, and say which held.

A case holds when: it ends in time; no traceback, MemoryError or kill; no fake secret in what it printed;
no line over MAX_LINE characters and no terminal control character; and its exit code is the one expected
("refused": non-zero, "ok": zero, "either"). Case files (cases/*.py) define CASES, a list of Case.
"""
from __future__ import annotations

import atexit
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "fixtures"
MAX_LINE = 1000
# Fake credentials in every case's environment: none may ever be printed. Names a user's shell really has.
CANARIES = {
    "HF_TOKEN": "hf_CANARYtok3nNeverPrint01",
    "WANDB_API_KEY": "CANARYwandb0123456789abcdef",
    "GITHUB_TOKEN": "ghp_CANARYgithub0123456789",
    "AWS_SECRET_ACCESS_KEY": "CANARYawsSecret0123456789/+abc",
    "DATABASE_URL": "postgres://user:CANARYdbPassw0rd@db.internal:5432/app",
}
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f\x9b]")  # C0 (but tab, newline) and DEL, CSI


@dataclass(frozen=True)
class Case:
    """One try. `argv` (a command; "datapipe" runs this venv's CLI) or `code` (Python run with -c); "{tmp}",
    "{repo}", "{fixtures}" in either are replaced. `setup(tmp)` builds the input in the case's own folder."""
    name: str
    argv: tuple[str, ...] | list[str] | None = None
    code: str | None = None
    setup: Callable[[Path], None] | None = None
    expect: str = "refused"  # "refused" | "ok" | "either"
    timeout_s: float = 60.0
    mem_mb: int = 4096
    env: dict[str, str] = field(default_factory=dict)
    stdin: bytes = b""

    def __post_init__(self) -> None:
        if (self.argv is None) == (self.code is None):
            raise ValueError(f"case {self.name!r}: give argv or code, one of them")
        if self.expect not in ("refused", "ok", "either"):
            raise ValueError(f"case {self.name!r}: expect is 'refused', 'ok' or 'either', not {self.expect!r}")


_packed: dict[str, Path] = {}


def packed_fixture(name: str) -> Path:
    """The fixture image folder converted once a run to `name` (a.lmdb, d.wds, x.h5: the format by its
    suffix), shared by the cases that read it (removed at exit)."""
    if name not in _packed:
        root = Path(tempfile.mkdtemp(prefix="adv-packed-"))
        atexit.register(shutil.rmtree, root, True)
        subprocess.run([sys.executable, "-m", "datapipe", "convert", str(FIXTURES / "imagefolder"), str(root / name)],
                       check=True, capture_output=True, timeout=180)
        _packed[name] = root / name
    return _packed[name]


def linking(*names: str) -> Callable[[Path], None]:
    """A setup linking the packed fixtures `names` into the case's folder."""
    def setup(tmp: Path) -> None:
        for name in names:
            (tmp / name).symlink_to(packed_fixture(name))
    return setup


@dataclass(frozen=True)
class Outcome:
    name: str
    held: bool
    verdict: str  # "held", or what broke: hang, traceback, memory, killed, leak, long-line, control-char, exit
    rc: int | None
    seconds: float
    peak_mb: float
    last_line: str


def _command(case: Case, tmp: Path) -> list[str]:
    def fill(text: str) -> str:
        return text.replace("{tmp}", str(tmp)).replace("{repo}", str(REPO)).replace("{fixtures}", str(FIXTURES))
    if case.code is not None:
        return [sys.executable, "-c", fill(case.code)]
    argv = [fill(a) for a in case.argv]
    if argv[0] == "datapipe":
        argv = [sys.executable, "-m", "datapipe", *argv[1:]]
    elif argv[0] == "python":
        argv[0] = sys.executable
    return argv


def _limits(mem_mb: int) -> Callable[[], None]:
    def apply() -> None:
        cap = mem_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    return apply


MAX_OUTPUT = 4 << 20  # bytes of output kept; the rest is read and dropped (a case may print gigabytes)


def _drain(stream, kept: bytearray) -> None:
    while chunk := stream.read(65536):
        kept.extend(chunk[:max(0, MAX_OUTPUT - len(kept))])


def _run(case: Case, tmp: Path) -> tuple[int | None, bytes, float, float]:
    """(exit code or None when it ran past its timeout, output, seconds, peak RSS in MB of the case's process)."""
    env = {**os.environ, **CANARIES, "PYTHONPATH": str(REPO), "HOME": str(tmp / "home"), **case.env}
    (tmp / "home").mkdir(exist_ok=True)
    start = time.monotonic()
    proc = subprocess.Popen(_command(case, tmp), cwd=tmp, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_limits(case.mem_mb))
    kept = bytearray()
    reader = threading.Thread(target=_drain, args=(proc.stdout, kept), daemon=True)
    reader.start()
    try:
        proc.stdin.write(case.stdin)
        proc.stdin.close()
    except BrokenPipeError:
        pass
    rc: int | None = None
    peak = 0.0
    while time.monotonic() - start < case.timeout_s:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)  # wait4: this child's own peak RSS
        if pid:
            rc, peak = os.waitstatus_to_exitcode(status), usage.ru_maxrss / 1024
            proc.returncode = rc
            break
        time.sleep(0.02)
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # past its time, or whatever it left running in its session
    except ProcessLookupError:
        pass
    if rc is None:
        proc.wait()
    reader.join(5)
    return rc, bytes(kept), time.monotonic() - start, peak


def judge(case: Case, rc: int | None, text: str) -> str:
    """The verdict on one finished case: "held" or the first thing that broke."""
    if rc is None:
        return "hang"
    if any(secret in text for secret in CANARIES.values()) or "CANARYdbPassw0rd" in text:
        return "leak"
    if "MemoryError" in text or rc in (-signal.SIGKILL, 137):
        return "memory"
    if "Traceback (most recent call last)" in text:
        return "traceback"
    if rc < 0:
        return "killed"
    if any(len(line) > MAX_LINE for line in text.splitlines()):
        return "long-line"
    if _CONTROL.search(text.replace("\r\n", "\n")):
        return "control-char"
    if (case.expect == "refused" and rc == 0) or (case.expect == "ok" and rc != 0):
        return "exit"
    return "held"


def run_case(case: Case) -> Outcome:
    tmp = Path(tempfile.mkdtemp(prefix="adv-"))
    try:
        if case.setup is not None:
            case.setup(tmp)
        rc, out, seconds, peak = _run(case, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    text = out.decode("utf-8", "replace")
    lines = [line for line in text.splitlines() if line.strip()]
    verdict = judge(case, rc, text)
    last = (lines[-1] if lines else "")[:200].encode("unicode_escape").decode("ascii")
    return Outcome(case.name, verdict == "held", verdict, rc, round(seconds, 2), round(peak, 1), last)
