"""The surfaces the house move (#49, 0ef9865 and 7ee8f8e) changed: make_loader's `interleave_shards=` and its
old name `mix_shards=`; a loader state carrying "mix_shards" (the key before #49) or "interleave_shards", read
back by ShardOrder.restore, as a hostile or hand-edited state gives it; BackendSpec's new fields (transforms,
inline_without_workers, requires, extra, preview) as a careless or hostile plugin author sets them, then
make_loader, datapipe.preview and `datapipe preview` over that backend; and the command line split into a
module a subcommand, tried as a careless user (missing and bad arguments, each subcommand's --help).

A case that checks more than its exit (a refusal that does not say what was wrong, a file a check wrote, a
printed install hint that a shell would run as several commands) prints a line starting "WRONG" and exits
with the code its expectation rules out, so the run shows it as "exit" with that line."""
from __future__ import annotations

import atexit
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tools.adversarial.harness import FIXTURES, Case

BIG = 16384  # MB of address space: torch maps far more than it touches
ESC = "\x1b]0;pwned\x07\x1b[2J"
_made: dict[str, Path] = {}


def _wds() -> Path:
    """The fixture folder as a .wds of 4 shards (64 KiB each), made once a run: interleaving needs shards."""
    if "wds" not in _made:
        root = Path(tempfile.mkdtemp(prefix="adv-house-"))
        atexit.register(shutil.rmtree, root, True)
        subprocess.run([sys.executable, "-m", "datapipe", "convert", str(FIXTURES / "imagefolder"), str(root / "d.wds"),
                        "--shard-size", "64KiB", "-q"], check=True, capture_output=True, timeout=180)
        _made["wds"] = root / "d.wds"
    return _made["wds"]


def wds(tmp: Path) -> None:
    (tmp / "d.wds").symlink_to(_wds())


def with_packages(tmp: Path) -> None:
    """d.wds, and pk/ holding `boom` (its import raises, as a torch_xla built for another torch does) and
    `side` (its import writes SIDE_EFFECT in the working folder)."""
    wds(tmp)
    (tmp / "pk" / "boom").mkdir(parents=True)
    (tmp / "pk" / "boom" / "__init__.py").write_text('raise RuntimeError("boom: built for another torch")\n')
    (tmp / "pk" / "side").mkdir()
    (tmp / "pk" / "side" / "__init__.py").write_text('open("SIDE_EFFECT", "w").write("imported")\n')


def code_case(name: str, code: str, expect: str, setup=wds, timeout_s: float = 120) -> Case:
    return Case(name, code=code, setup=setup, expect=expect, timeout_s=timeout_s, mem_mb=BIG)


# ---- make_loader(..., interleave_shards=N) and its former name mix_shards= ------------------------------------------
MAKE = """
import sys
import datapipe
try:
    loader = datapipe.make_loader("d.wds", sampling="shards", backend="threads", num_workers=1, batch_size=4,
                                  image_size=32, @ARGS@)
except ValueError as exc:
    message = str(exc)
    assert "\\n" not in message and len(message) < 1000, message[:300]
    print("refused:", message)
    sys.exit(2)
served = sum(len(batch.indices) for batch in loader)
state = loader.state_dict()
if "mix_shards" in state or "interleave_shards" not in state:
    sys.exit(f"WRONG: the state's keys {sorted(state)}")
print(f"accepted: interleave_shards={loader.options.interleave_shards!r:.60}, {served} served, state key "
      f"interleave_shards={state['interleave_shards']!r:.60}")
"""


def make(name: str, args: str, expect: str = "refused") -> Case:
    return code_case(f"make_loader({name})", MAKE.replace("@ARGS@", args), expect)


OPTIONS = """
import sys
import datapipe
from datapipe import LoaderOptions
try:
    options = LoaderOptions(mix_shards=3)  # a public dataclass whose field had this name before #49
    loader = datapipe.make_loader("d.wds", options=options, sampling="shards", backend="threads", num_workers=1,
                                  batch_size=4, image_size=32)
except ValueError as exc:
    print("refused:", exc)
    sys.exit(2)
print("accepted: interleave_shards", loader.options.interleave_shards)
"""

MAKES = [
    make("mix_shards=3 (the former name)", "mix_shards=3", expect="ok"),
    make("interleave_shards=3", "interleave_shards=3", expect="ok"),
    make("mix_shards=3, interleave_shards=3 (both, alike)", "mix_shards=3, interleave_shards=3"),
    make("mix_shards=2, interleave_shards=5 (both, differing)", "mix_shards=2, interleave_shards=5"),
    make("mix_shards=None", "mix_shards=None", expect="ok"),
    make("mix_shards=0", "mix_shards=0"),
    make("mix_shards=-1", "mix_shards=-1"),
    make("mix_shards=True", "mix_shards=True"),
    make("mix_shards='4'", "mix_shards='4'"),
    make("mix_shards=2.0", "mix_shards=2.0"),
    make("mix_shards=float('nan')", "mix_shards=float('nan')"),
    make("mix_shards=[[2]]", "mix_shards=[[2]]"),
    make("mix_shards=10**400 (past the shards: one block of all)", "mix_shards=10**400", expect="ok"),
    make("interleave_shards=10**30 with a state saved", "interleave_shards=10**30", expect="ok"),
    code_case("LoaderOptions(mix_shards=3) (the public options class, the old field name)", OPTIONS, expect="either"),
]


# ---- loader.load_state_dict(state) with the interleave key as a hostile or hand-edited state gives it ---------------
STATE = """
import sys
import datapipe
KW = dict(sampling="@SAMPLING@", backend="threads", num_workers=1, batch_size=4, image_size=32@BLOCK@)
first = datapipe.make_loader("d.wds", **KW)
batches = iter(first)
if @MID@:
    next(batches)
state = first.state_dict()
want = next(batches).indices.tolist()
@PATCH@
second = datapipe.make_loader("d.wds", **KW)
try:
    second.load_state_dict(state)
except ValueError as exc:
    message = str(exc)
    assert "\\n" not in message and len(message) < 1000, message[:300]
    if "shards" not in message:
        print("WRONG (the refusal names neither key nor the state):", message)
        sys.exit(0)
    print("refused:", message)
    sys.exit(2)
got = next(iter(second)).indices.tolist()
print("resumed", "at the batch the first loader served next" if got == want else f"at {got}, not {want}")
"""
OLD_KEY = 'state.pop("interleave_shards")\nstate["mix_shards"] = '
NEW_KEY = 'state["interleave_shards"] = '


def state(name: str, patch: str, expect: str = "refused", *, mid: bool = True, sampling: str = "shards") -> Case:
    code = (STATE.replace("@PATCH@", patch).replace("@MID@", str(mid)).replace("@SAMPLING@", sampling)
            .replace("@BLOCK@", ", interleave_shards=2" if sampling == "shards" else ""))
    where = "mid-epoch" if mid else "at an epoch boundary"
    return code_case(f"load_state_dict {where}, {name}", code, expect)


STATES = [
    state('"mix_shards": 2 (a state saved before #49, the same block)', OLD_KEY + "2", expect="ok"),
    state('"mix_shards": 3 (another block: a warning)', OLD_KEY + "3", expect="ok"),
    state('"interleave_shards": 2, "mix_shards": 7 (both keys, disagreeing)', 'state["mix_shards"] = 7',
          expect="either"),
    state('"interleave_shards": 7, "mix_shards": 2 (both keys, disagreeing)', NEW_KEY + '7\nstate["mix_shards"] = 2',
          expect="either"),
    state('"mix_shards": "abc"', OLD_KEY + '"abc"'),
    state('"interleave_shards": "x" * 10**6', NEW_KEY + '"x" * 10**6'),
    state('"interleave_shards": "4" (a string of digits)', NEW_KEY + '"4"', expect="either"),
    state('"interleave_shards": True', NEW_KEY + "True", expect="either"),
    state('"mix_shards": -5', OLD_KEY + "-5", expect="either"),
    state('"interleave_shards": 2.7', NEW_KEY + "2.7", expect="either"),
    state('"interleave_shards": nan', NEW_KEY + 'float("nan")'),
    state('"interleave_shards": inf', NEW_KEY + 'float("inf")'),
    state('"interleave_shards": None', NEW_KEY + "None"),
    state('"mix_shards": None', OLD_KEY + "None"),
    state('"mix_shards": None', OLD_KEY + "None", expect="either", mid=False),
    state('"interleave_shards": [[2]] (a nested list)', NEW_KEY + "[[2]]"),
    state('"interleave_shards": 10**1200 (another block: the warning quotes it)', NEW_KEY + "10**1200",
          expect="either"),
    state('"mix_shards": 10**5000 (past str(int)\'s 4,300 digits)', OLD_KEY + "10**5000", expect="either"),
    state('"mix_shards": None, sampling="global" (no shard position: the key is not read)',
          'state["mix_shards"] = None', expect="ok", sampling="global"),
]

# `datapipe train --resume last.pt` where last.pt's loader state was saved by an older datapipe and edited
RESUME = """
import subprocess, sys
from pathlib import Path
from datapipe.train import checkpoint
ARGS = ["d.wds", "--out", "run", "--model", "resnet18", "--epochs", "1", "--batch-size", "4", "--image-size", "32",
        "--workers", "0", "--backend", "dataloader", "--tensorboard", "off", "--sampling", "shards"]
made = subprocess.run([sys.executable, "-m", "datapipe", "train", *ARGS, "--max-steps", "2"], capture_output=True,
                      text=True, timeout=240)
if made.returncode != 0:
    sys.exit("setup: the first run failed: " + (made.stdout + made.stderr)[-300:])
saved = checkpoint.load("run/last.pt")
saved["loader"].pop("interleave_shards", None)
saved["loader"]["mix_shards"] = @VALUE@
checkpoint.save(Path("run/last.pt"), saved)
done = subprocess.run([sys.executable, "-m", "datapipe", "train", *ARGS, "--max-steps", "3", "--resume",
                       "run/last.pt"], capture_output=True, text=True, timeout=240)
out = (done.stdout + done.stderr).strip()
print(out[-3000:])
if done.returncode != 0 and "shards" not in out.splitlines()[-1]:
    print("WRONG (the refusal names neither the key nor the checkpoint's loader state):", out.splitlines()[-1])
    sys.exit(0)
sys.exit(done.returncode)
"""


def resume(name: str, value: str, expect: str = "refused") -> Case:
    return code_case(f"train --resume last.pt whose loader state has {name}", RESUME.replace("@VALUE@", value),
                     expect, timeout_s=400)


RESUMES = [
    resume('"mix_shards": 1 (saved before #49)', "1", expect="ok"),
    resume('"mix_shards": None', "None"),
    resume('"mix_shards": "abc"', '"abc"'),
]


# ---- BackendSpec's new fields, as a plugin author sets them ----------------------------------------------------------
SPEC = """
import os, sys
sys.path.insert(0, "pk")
from datapipe.backends.registry import BackendSpec, register_backend
from datapipe.backends.threads import ThreadLoader
try:
    spec = register_backend(BackendSpec("mine", ThreadLoader, auto=lambda s: None, @FIELDS@))
except ValueError as exc:
    message = str(exc)
    assert "\\n" not in message and len(message) < 1000, message[:300]
    print("refused:", message)
    sys.exit(2)
@THEN@
"""
ACCEPTED = 'print("accepted:", repr(spec)[:300])'


def spec(name: str, fields: str, then: str = ACCEPTED, expect: str = "refused", setup=with_packages,
         timeout_s: float = 120) -> Case:
    return code_case(f"BackendSpec({name})", SPEC.replace("@FIELDS@", fields).replace("@THEN@", then), expect,
                     setup=setup, timeout_s=timeout_s)


# the CLI's parser reads the registry when built: a plugin registered first is a --backends choice
PREVIEW_CLI = """
from datapipe.cli.main import main
code = main(["preview", "d.wds", "--out", "out/x.png", "--backends", @BACKENDS@, "--records", "2", "--epochs", "1",
             "--image-size", "32"])
if os.path.exists("SIDE_EFFECT") or "side" in sys.modules:
    print("WRONG: checking whether the backend's requirement is installed imported it (pk/side ran)")
    sys.exit(1)
sys.exit(code)
"""
PREVIEW_API = """
import datapipe.preview as p
from datapipe.errors import ExpectedError
try:
    shown = p.preview("d.wds", p.PreviewOptions(backends=@BACKENDS@, records=2, epochs=1, image_size=32))
except (ValueError, ExpectedError) as exc:
    print("refused:", str(exc)[:300])
    sys.exit(2)
print("notes:", [n[:200] for n in shown.notes], "rows:", sorted({r.backend for r in shown.rows}))
"""
PREVIEW_DEFAULT = """
from datapipe.cli.main import main
code = main(["preview", "d.wds", "--out", "x.png", "--records", "2", "--epochs", "1", "--image-size", "32"])
if code == 0 and not os.path.exists("x.png"):
    print("WRONG: no x.png")
    sys.exit(1)
sys.exit(code)
"""
HINT = """
import shlex
hint = spec.install_hint()
words = shlex.split(hint)
if len(words) != 3 or words[:2] != ["pip", "install"]:
    print("WRONG: the install hint a user pastes is not one pip command:", repr(hint)[:300])
    sys.exit(0)
print("accepted, a safe hint:", hint[:200])
"""
TRANSFORM = """
import datapipe
try:
    datapipe.make_loader("d.wds", backend="mine", batch_size=4, image_size=32, num_workers=@WORKERS@,
                         transform=lambda image: image)
except ValueError as exc:
    print("refused:", exc)
    sys.exit(2)
print("accepted an opaque transform with num_workers=@WORKERS@")
"""


def preview_cli(backends: str) -> str:
    return PREVIEW_CLI.replace("@BACKENDS@", repr(backends))


SPECS = [
    spec("transforms=None", "transforms=None"),
    spec("transforms='ANY'", "transforms='ANY'"),
    spec("transforms=['any']", "transforms=['any']"),
    spec("transforms=''", "transforms=''"),
    spec("transforms with escapes", f"transforms={ESC!r}"),
    spec("requires=1", "requires=1"),
    spec("requires='a b'", "requires='a b'"),
    spec("requires='ray; rm -rf ~'", "requires='ray; rm -rf ~'"),
    spec("requires=\"ray'\"", "requires=\"ray'\""),
    spec("requires='.ray' (relative)", "requires='.ray'"),
    spec("requires='ray..x'", "requires='ray..x'"),
    spec("requires with escapes", f"requires={ESC!r}"),
    spec("requires='x ' * 500_000 (1 MB, not a name)", "requires='x ' * 500_000"),
    spec("requires='m' * 10**6 (1 MB, an identifier), then datapipe preview", "requires='m' * 10**6",
         then=preview_cli("threads,mine"), expect="either"),
    spec("requires='boom.sub' (boom's import raises), then datapipe preview", "requires='boom.sub'",
         then=preview_cli("threads,mine"), expect="ok"),
    spec("requires='boom.sub' (boom's import raises), then datapipe.preview.preview", "requires='boom.sub'",
         then=PREVIEW_API.replace("@BACKENDS@", "('threads', 'mine')"), expect="ok"),
    spec("requires='side.sub' (side's import writes a file), then datapipe preview", "requires='side.sub'",
         then=preview_cli("threads,mine"), expect="ok"),
    spec("requires='os.nope' (os is not a package), then datapipe preview", "requires='os.nope'",
         then=preview_cli("threads,mine"), expect="ok"),
    spec("requires='no_such_module_xyz', then datapipe preview (skipped: a note)", "requires='no_such_module_xyz'",
         then=preview_cli("threads,mine"), expect="ok"),
    spec("requires='no_such_module_xyz', then datapipe preview of it alone", "requires='no_such_module_xyz'",
         then=preview_cli("mine")),
    spec("requires='no_such_module_xyz', then make_loader(backend=NAME) (not checked: the loader imports)",
         "requires='no_such_module_xyz'",
         then='import datapipe\ndatapipe.make_loader("d.wds", backend="mine", batch_size=4, image_size=32)\n'
              'print("accepted")', expect="either"),
    spec("extra=5", "requires='no_such_module_xyz', extra=5"),
    spec("extra with quotes and ';' (a pasted hint runs more)", "requires='no_such_module_xyz', "
         "extra=\"x]' ; touch ~/pwned ; echo '\"", then=HINT),
    spec("extra with a space", "requires='no_such_module_xyz', extra='dali ray'", then=HINT),
    spec("extra with escapes, then datapipe preview", f"requires='no_such_module_xyz', extra={ESC!r}",
         then=preview_cli("threads,mine"), expect="either"),
    spec("extra of 1 MB, then datapipe preview", "requires='no_such_module_xyz', extra='e' * 10**6",
         then=preview_cli("threads,mine"), expect="either"),
    spec("inline_without_workers='no' (a truthy str)", "inline_without_workers='no'"),
    spec("inline_without_workers='no', then an opaque transform with num_workers=0", "inline_without_workers='no'",
         then=TRANSFORM.replace("@WORKERS@", "0")),
    spec("inline_without_workers=True, an opaque transform with num_workers=0 (documented)",
         "inline_without_workers=True", then=TRANSFORM.replace("@WORKERS@", "0"), expect="ok"),
    spec("inline_without_workers=True, an opaque transform with num_workers=1", "inline_without_workers=True",
         then=TRANSFORM.replace("@WORKERS@", "1")),
    spec("transforms='none', then a transform", "transforms='none'", then=TRANSFORM.replace("@WORKERS@", "1")),
    spec("preview='no' (a truthy str)", "preview='no'"),
    spec("preview=True (the default), then datapipe preview's default rows", "preview=True",
         then=PREVIEW_DEFAULT, expect="ok", timeout_s=240),
]

REPLACED = """
import sys
import datapipe
from datapipe.backends.registry import BackendSpec, register_backend
register_backend(BackendSpec("dataloader", ".dataloader:ProcessLoader", transforms="portable"), replace=True)
register_backend(BackendSpec("prefetch", ".prefetch:PrefetchLoader", transforms="portable"), replace=True)
try:
    datapipe.make_loader("d.wds", backend="threads", batch_size=4, image_size=32, num_workers=1,
                         transform=lambda image: image)
except ValueError as exc:
    message = str(exc)
    if "backend=," in message or "backend= " in message:
        print("WRONG (names no backend to use):", message)
        sys.exit(0)
    print("refused:", message)
    sys.exit(2)
print("accepted")
"""
TRANSFORM_VALUE = """
import sys
import datapipe
class Loud:
    def __repr__(self):
        raise RuntimeError("a repr that raises")
try:
    datapipe.make_loader("d.wds", backend="threads", batch_size=4, image_size=32, num_workers=1, transform=@VALUE@)
except ValueError as exc:
    message = str(exc)
    assert "\\n" not in message and len(message) < 1000, f"a message of {len(message):,} characters"
    print("refused:", message)
    sys.exit(2)
print("accepted")
"""
TRANSFORMS = [
    code_case("make_loader(transform=...) where no registered backend takes an opaque one", REPLACED, "refused"),
    code_case("make_loader(transform='x' * 10**6)", TRANSFORM_VALUE.replace("@VALUE@", "'x' * 10**6"), "refused"),
    code_case("make_loader(transform=an object whose repr raises)", TRANSFORM_VALUE.replace("@VALUE@", "Loud()"),
              "refused"),
]

PREVIEW_OPTIONS = """
import sys
from datapipe.preview import PreviewOptions
try:
    PreviewOptions(backends=@VALUE@)
except ValueError as exc:
    message = str(exc)
    assert "\\n" not in message and len(message) < 1000, f"a message of {len(message):,} characters"
    if "t,h,r" in message:
        print("WRONG (a str read as its letters):", message)
        sys.exit(0)
    print("refused:", message)
    sys.exit(2)
print("accepted")
"""


def options(name: str, value: str, expect: str = "refused") -> Case:
    return code_case(f"PreviewOptions(backends={name})", PREVIEW_OPTIONS.replace("@VALUE@", value), expect, setup=None)


OPTION_CASES = [
    options("['threads'] (a list)", "['threads']", expect="ok"),
    options("'threads' (a str)", "'threads'"),
    options("None", "None"),
    options("('threads', 5)", "('threads', 5)"),
    options("('ray',) (named only)", "('ray',)"),
    options("('threads', 'x' * 10**6)", "('threads', 'x' * 10**6)"),
    options("(an escape,)", repr((ESC,))),
]


# ---- the command line, a module a subcommand, as a careless user types it --------------------------------------------
def cli(name: str, *argv: str, expect: str = "refused", setup=wds, timeout_s: float = 120) -> Case:
    return Case(f"datapipe {name}", argv=["datapipe", *argv], setup=setup, expect=expect, timeout_s=timeout_s,
                mem_mb=BIG)


SAYS = """
import os, subprocess, sys
done = subprocess.run([sys.executable, "-m", "datapipe", *@ARGV@], capture_output=True, text=True, timeout=240)
out = (done.stdout + done.stderr).strip()
print(out[-2000:])
last = out.splitlines()[-1] if out else ""
if done.returncode != 0 and not any(word in last for word in @WORDS@):
    print("WRONG (the error does not say what is wrong; expected one of @WORDS@):", last[:300])
    sys.exit(0)
for path in @ABSENT@:
    if os.path.exists(path):
        print("WRONG: wrote", path)
        sys.exit(0)
sys.exit(done.returncode)
"""


def says(name: str, argv: list[str], words: tuple[str, ...], absent: tuple[str, ...] = ()) -> Case:
    code = SAYS.replace("@ARGV@", repr(argv)).replace("@WORDS@", repr(words)).replace("@ABSENT@", repr(absent))
    return code_case(f"datapipe {name}", code, "refused", timeout_s=240)


ODD = "my data 'v2\".wds"  # a space and both quotes
CLIS = [
    cli("(no subcommand)"),
    cli("nope", "nope"),
    cli("--help", "--help", expect="ok"),
    *[cli(f"{command} --help", command, "--help", expect="ok") for command in
      ("convert", "info", "verify", "bench", "train", "doctor", "preview")],
    cli("convert (no arguments)", "convert"),
    cli("convert SRC (no DST)", "convert", str(FIXTURES / "imagefolder")),
    cli("convert SRC o.xyz (an unknown suffix)", "convert", str(FIXTURES / "imagefolder"), "o.xyz"),
    cli("convert --shard-size bad", "convert", str(FIXTURES / "imagefolder"), "o.wds", "--shard-size", "bad"),
    cli("convert --shard-size 64KB (under 64 KiB)", "convert", str(FIXTURES / "imagefolder"), "o.wds",
        "--shard-size", "64KB"),
    cli("convert --workers x", "convert", str(FIXTURES / "imagefolder"), "o.wds", "--workers", "x"),
    cli("convert --format nope", "convert", str(FIXTURES / "imagefolder"), "o.wds", "--format", "nope"),
    says("convert from a missing folder with a space and quotes", ["convert", ODD, "o.lmdb"],
         ("not a folder", "does not exist", "no such"), absent=("o.lmdb",)),
    cli("convert to a path with a space and quotes", "convert", str(FIXTURES / "imagefolder"), ODD, "-q",
        expect="ok", timeout_s=180),
    cli("bench --pool-resources bad", "bench", "d.wds", "--pool-resources", "bad"),
    cli("bench --pool-resources =1 (no name)", "bench", "d.wds", "--pool-resources", "=1"),
    cli("bench --pool-resources a=1,a=2", "bench", "d.wds", "--pool-resources", "a=1,a=2"),
    cli("bench --pool-resources a=nan", "bench", "d.wds", "--pool-resources", "a=nan"),
    cli("bench --pool-workers x", "bench", "d.wds", "--pool-workers", "x"),
    cli("bench --pool-resources datapipe=1, a short run (7ee8f8e: the split had lost the flag's value)", "bench",
        "d.wds", "--backends", "threads", "--suites", "read", "--seconds", "0.2", "--repeats", "1", "--warmup", "0",
        "--pool-resources", "datapipe=1", expect="ok"),
    cli("bench --pool-workers 0", "bench", "d.wds", "--pool-workers", "0"),
    cli("bench --backends nope", "bench", "d.wds", "--backends", "nope"),
    cli("train --pool-workers x --pool-resources a=b", "train", "d.wds", "--out", "o", "--pool-workers", "x",
        "--pool-resources", "a=b"),
    cli("train --pool-resources a=b", "train", "d.wds", "--out", "o", "--pool-resources", "a=b"),
    cli("train --backend nope", "train", "d.wds", "--out", "o", "--backend", "nope"),
    says("preview --backends nope", ["preview", "d.wds", "--out", "o.png", "--backends", "nope"], ("nope",),
         absent=("o.png",)),
    cli("preview --backends '' (none)", "preview", "d.wds", "--out", "o.png", "--backends", ""),
    cli("preview --backends ray (named only)", "preview", "d.wds", "--out", "o.png", "--backends", "ray"),
    cli("preview --backends threads,threads", "preview", "d.wds", "--out", "o.png", "--backends", "threads,threads"),
    cli("preview --backends with escapes", "preview", "d.wds", "--out", "o.png", "--backends", ESC),
    cli("preview --backends of 100,000 characters", "preview", "d.wds", "--out", "o.png", "--backends", "b" * 100_000),
    cli("preview --backends threads (into a path with a space and quotes)", "preview", "d.wds", "--out",
        "my 'grid\".png", "--backends", "threads", "--records", "2", "--epochs", "1", "--image-size", "32",
        expect="ok"),
    says("info on a missing path", ["info", "/nonexistent/d.wds"], ("does not exist",)),
    says("info on a missing path with a space and quotes", ["info", ODD], ("does not exist",)),
    says("verify on a missing path", ["verify", "/nonexistent/d.wds"], ("does not exist", "no such", "No such")),
    says("verify on a missing path with a space and quotes", ["verify", ODD], ("does not exist", "no such", "No such")),
    cli("info -v after the subcommand", "info", "-v", "d.wds"),
    cli("doctor --bogus", "doctor", "--bogus"),
]

CASES = [*MAKES, *STATES, *RESUMES, *SPECS, *TRANSFORMS, *OPTION_CASES, *CLIS]
