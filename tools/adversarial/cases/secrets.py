"""Secrets of the environment against every command that builds a DALI graph or starts a Ray, and against a
careless user who puts a credential in a path, a URL or a Ray address (issue #47: DALI's AutoGraph printed
os.environ whole). The harness puts its CANARIES in every case's environment and fails a case that prints one."""
from __future__ import annotations

import atexit
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tools.adversarial.harness import CANARIES, FIXTURES, Case

BIG = 16384  # MB of address space: torch, DALI and Ray map far more than they touch
SMALL = ["--batch-size", "4", "--image-size", "32", "--workers", "1"]
BENCH = ["--suites", "pipeline", "--seconds", "0.2", "--repeats", "1", "--warmup", "0", *SMALL]
TRAIN = ["--max-steps", "1", "--model", "resnet18", *SMALL]
NO_DB_PASSWORD = {"DATABASE_URL": "postgres://db.internal:5432/app"}
_shared: list[Path] = []


def dataset(tmp: Path) -> None:
    """{tmp}/d.wds: the fixture folder packed once for all cases (linked into each case's folder)."""
    if not _shared:
        root = Path(tempfile.mkdtemp(prefix="adv-secrets-"))
        atexit.register(shutil.rmtree, root, True)
        subprocess.run([sys.executable, "-m", "datapipe", "convert", str(FIXTURES / "imagefolder"),
                        str(root / "d.wds")], check=True, capture_output=True, timeout=120)
        _shared.append(root / "d.wds")
    (tmp / "d.wds").symlink_to(_shared[0])


def dali(name: str, *argv: str, env: dict | None = None, expect: str = "ok") -> Case:
    return Case(name, argv=["datapipe", *argv], setup=dataset, expect=expect, timeout_s=180, mem_mb=BIG, env=env or {})


# a library's dump of the environment, with a PEM key and a credential under a name that says nothing
LIBRARY_DUMP = """
import io, logging, os, sys
os.environ["SERVICE_PRIVATE_KEY"] = "-----BEGIN KEY-----\\nMIIEvQIBADANBgkqPEMSECRET\\n-----END KEY-----"
os.environ["MY_SERVICE_CONN"] = "opaque-conn-string-0042"
from datapipe.backends.dali import require_dali
require_dali()
out = io.StringIO()
logging.getLogger().addHandler(logging.StreamHandler(out))
logging.warning("could not transform %s", os.environ.setdefault)
logging.warning("%r", dict(os.environ))
text = out.getvalue()
sys.exit(1 if "PEMSECRET" in text or "opaque-conn-string-0042" in text else 0)
"""
# AUTOGRAPH_VERBOSITY=10 makes DALI's AutoGraph log every converted function (lines of 10,000+ characters,
# the user's own request): searched here for a secret or a dump of the environment, not judged for length
VERBOSE_AUTOGRAPH = """
import os, subprocess, sys
from tools.adversarial.harness import CANARIES
done = subprocess.run([sys.executable, "-m", "datapipe", "preview", "d.wds", "--recipe", "deit", "--backends", "dali",
                       "--epochs", "1", "--out", "g.png"], capture_output=True, text=True,
                      env={**os.environ, "AUTOGRAPH_VERBOSITY": "10"})
text = done.stdout + done.stderr
found = [name for name, value in CANARIES.items() if value in text] + ["environ("] * ("environ(" in text)
print(f"rc {done.returncode}, {len(text)} characters of output, found: {found or 'nothing'}")
sys.exit(1 if found or done.returncode else 0)
"""
LIBRARY_LOADER = """
from datapipe import make_loader
loader = make_loader("d.wds", backend="dali", recipe="deit", batch_size=4, image_size=32, device="cpu", num_workers=1)
images, labels, indices = next(iter(loader))
print(tuple(images.shape))
"""
LIBRARY_WARNING = """
import os, warnings
from datapipe.backends.dali import require_dali
require_dali()
warnings.warn("a library quotes " + os.environ["HF_TOKEN"] + " in a warning")
"""

CASES = [
    dali("preview deit on dali", "preview", "{tmp}/d.wds", "--recipe", "deit", "--backends", "dali", "--epochs", "1",
         "--out", "{tmp}/g.png"),
    dali("preview rsb-a3 on dali", "preview", "{tmp}/d.wds", "--recipe", "rsb-a3", "--backends", "dali",
         "--epochs", "1", "--out", "{tmp}/g.png"),
    dali("preview tv-v2 on dali, all backends", "preview", "{tmp}/d.wds", "--recipe", "tv-v2", "--epochs", "1",
         "--out", "{tmp}/g.png"),
    dali("train deit on dali one step", "train", "{tmp}/d.wds", "--backend", "dali", "--recipe", "deit", *TRAIN,
         "--out", "{tmp}/run"),
    dali("bench deit on dali", "bench", "{tmp}/d.wds", "--backends", "dali", "--recipe", "deit", *BENCH,
         expect="either"),  # a run this short may be refused as too short to measure
    Case("AutoGraph at verbosity 10 on a deit preview (its ~1 MB of debug lines searched)", code=VERBOSE_AUTOGRAPH,
         setup=dataset, expect="ok", timeout_s=180, mem_mb=BIG),
    dali("DALI_ENABLE_CSE set to garbage", "preview", "{tmp}/d.wds", "--recipe", "deit", "--backends", "dali",
         "--epochs", "1", "--out", "{tmp}/g.png", env={"DALI_ENABLE_CSE": "maybe"}, expect="either"),
    dali("PYTHONWARNINGS=error on a dali train", "train", "{tmp}/d.wds", "--backend", "dali", "--recipe", "deit",
         *TRAIN, "--out", "{tmp}/run", env={"PYTHONWARNINGS": "error"}, expect="either"),
    dali("doctor --gpu without a GPU", "doctor", "--gpu", "{tmp}/d.wds"),
    Case("library: a dali deit loader, no CLI", code=LIBRARY_LOADER, setup=dataset, expect="ok", timeout_s=180,
         mem_mb=BIG),
    Case("library: a warning quoting a secret after the dali backend loads", code=LIBRARY_WARNING, expect="ok",
         timeout_s=120, mem_mb=BIG),
    Case("library: root-logger dumps of os.environ (PEM key, opaque name)", code=LIBRARY_DUMP, expect="ok",
         timeout_s=120, mem_mb=BIG),
    Case("a credential pasted as the dataset path", argv=["datapipe", "info", f"{{tmp}}/{CANARIES['HF_TOKEN']}/d.wds"]),
    Case("a URL with a password as the dataset",
         argv=["datapipe", "info", "http://reader:CANARYdbPassw0rd@127.0.0.1:9/d.wds"], timeout_s=120),
    Case("a presigned URL whose signature is a canary",
         argv=["datapipe", "info", f"http://127.0.0.1:9/d.wds?X-Amz-Signature={CANARIES['GITHUB_TOKEN']}&x=1"],
         timeout_s=120),
    Case("train on a URL with a password, dali backend",
         argv=["datapipe", "train", "http://u:CANARYdbPassw0rd@127.0.0.1:9/d.wds", "--backend", "dali", *TRAIN,
               "--out", "{tmp}/run"], timeout_s=120, mem_mb=BIG),
    Case("RAY_ADDRESS with a password, doctor --ray", argv=["datapipe", "doctor", "--ray"], timeout_s=120, mem_mb=BIG,
         env={"RAY_ADDRESS": "ray://admin:CANARYdbPassw0rd@127.0.0.1:1"}, expect="either"),  # doctor: a WARN row
    Case("doctor --ray at user:password@host", expect="either",
         argv=["datapipe", "doctor", "--ray", "admin:CANARYdbPassw0rd@127.0.0.1:1"], timeout_s=120, mem_mb=BIG),
    # the password in no variable of the environment (DATABASE_URL without it): only its place shows it is one
    Case("convert --ray-address with a password",
         argv=["datapipe", "convert", "{fixtures}/imagefolder", "{tmp}/r.wds", "--engine", "ray", "--ray-address",
               "ray://admin:CANARYdbPassw0rd@127.0.0.1:1"], timeout_s=120, mem_mb=BIG, env=NO_DB_PASSWORD),
    Case("bench --backends ray with RAY_ADDRESS holding a password", setup=dataset, timeout_s=120, mem_mb=BIG,
         argv=["datapipe", "bench", "{tmp}/d.wds", "--backends", "ray", *BENCH], expect="either",
         env={**NO_DB_PASSWORD, "RAY_ADDRESS": "admin:CANARYdbPassw0rd@127.0.0.1:1"}),
    dali("train deit on a local Ray one step", "train", "{tmp}/d.wds", "--backend", "ray", "--recipe", "deit", *TRAIN,
         "--out", "{tmp}/run"),
    dali("bench deit on a local Ray", "bench", "{tmp}/d.wds", "--backends", "ray", "--recipe", "deit", *BENCH,
         expect="either"),
    Case("convert --engine ray",
         argv=["datapipe", "convert", "{fixtures}/imagefolder", "{tmp}/r.wds", "--engine", "ray"], expect="ok",
         timeout_s=180, mem_mb=BIG),
]
