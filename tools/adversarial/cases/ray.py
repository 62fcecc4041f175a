"""Issue #47/#48's Ray surfaces: joining a cluster (RAY_ADDRESS for train and bench, convert --ray-address,
doctor --ray), token authentication, pool_resources, and the local Ray datapipe starts for itself under
the harness's address-space cap; tried as a careless user (dead, unresolvable, black-holed or garbled
addresses, a token in the wrong place, huge amounts) and a hostile environment (a port that is not Ray,
control characters in the address, a canary as the token)."""
from __future__ import annotations

import shutil
from pathlib import Path

from tools.adversarial.harness import CANARIES, FIXTURES, Case

IMAGES = "{fixtures}/imagefolder"
GOOD = "{tmp}/good"  # the fixture folder's plain JPEGs (its bad files are the decode cases' business)


def good_images(tmp: Path) -> None:
    for image in (FIXTURES / "imagefolder").glob("*/*/*_00?.jpg"):
        target = tmp / "good" / image.relative_to(FIXTURES / "imagefolder")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(image, target)


TINY_TRAIN = ["datapipe", "train", GOOD, "--backend", "ray", "--out", "{tmp}/o", "--model", "resnet18",
              "--epochs", "1", "--batch-size", "4", "--image-size", "32", "--workers", "1", "--pool-workers", "1",
              "--max-steps", "2"]
LOOPBACK = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}

# Python run in the case's process: a listener that is not Ray (or never answers), then a join to it.
NOT_RAY = """
import socket, threading
from datapipe.ray_setup import RayUnreachable, import_ray, join, loopback_only
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(8)
def serve():
    while True:
        c, _ = s.accept(); c.sendall(b"HTTP/1.0 200 OK\\r\\n\\r\\n\\x1b[31mhello\\n"); c.close()
threading.Thread(target=serve, daemon=True).start()
try:
    with loopback_only():
        join(import_ray(), f"127.0.0.1:{s.getsockname()[1]}", timeout_s=10)
except RayUnreachable as exc:
    raise SystemExit(f"refused: {exc}")
"""
BLACK_HOLE = """
import socket
from datapipe.ray_setup import RayUnreachable, import_ray, join, loopback_only
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(0)
queued = [socket.socket() for _ in range(3)]
for q in queued:
    q.setblocking(False); q.connect_ex(s.getsockname())
try:
    with loopback_only():
        join(import_ray(), f"127.0.0.1:{s.getsockname()[1]}", timeout_s=2)
except RayUnreachable as exc:
    raise SystemExit(f"refused: {exc}")
"""
# A token-auth local Ray here (Ray 2.60's default), then `datapipe doctor --ray` to it from a process
# without the token (another HOME), with a canary as a wrong token, and with the right one.
TOKEN = """
import os, subprocess, sys
from datapipe.ray_local import start_local, stop_local
from datapipe.ray_setup import import_ray
ray = import_ray()
start_local(ray, num_cpus=1, log_to_driver=False)
address = ray.get_runtime_context().gcs_address
base = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
os.makedirs("other", exist_ok=True)
token = open(os.path.expanduser("~/.ray/auth_token")).read().strip()
for extra in ({"HOME": os.path.abspath("other")}, {"HOME": os.path.abspath("other"), "RAY_AUTH_MODE": "token",
              "RAY_AUTH_TOKEN": os.environ["GITHUB_TOKEN"]}, {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}):
    done = subprocess.run([sys.executable, "-m", "datapipe", "doctor", "--ray", address], env={**base, **extra},
                          capture_output=True, text=True, timeout=120)
    out = done.stdout + done.stderr
    assert token not in out, "the token was printed"
    print([ln for ln in done.stdout.splitlines() if "ray_cluster" in ln][0][:300])
stop_local(ray)
"""
# Ray's token loader reads the file whole and blocking: RAY_AUTH_TOKEN_PATH at a FIFO or /dev/zero.
TOKEN_FILE = """
import os, subprocess, sys
from datapipe.ray_local import start_local, stop_local
from datapipe.ray_setup import import_ray
ray = import_ray()
start_local(ray, num_cpus=1, log_to_driver=False)
os.mkfifo("fifo")
for path in ("/dev/zero", os.path.abspath("fifo")):
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": path}
    done = subprocess.run([sys.executable, "-m", "datapipe", "doctor", "--ray", ray.get_runtime_context().gcs_address],
                          env=env, capture_output=True, text=True, timeout=60)
    print([ln for ln in done.stdout.splitlines() if "ray_cluster" in ln][0][:300])
stop_local(ray)
"""
LOADER = """
from datapipe import make_loader
loader = make_loader("{tmp}/good", backend="ray", pool_workers=1, batch_size=4, image_size=32, num_workers=1)
print(sum(len(b.indices) for b in loader), "images", "fell back" if loader.fell_back else "on the pool")
loader.close()
"""
BAD_AMOUNT = """
from datapipe import make_loader
try:
    make_loader("{fixtures}/imagefolder", backend="ray", pool_resources={{"datapipe": {amount}}})
except ValueError as exc:
    raise SystemExit(f"refused: {{exc}}")
"""

CASES = [
    Case("train: RAY_ADDRESS where nothing listens", argv=TINY_TRAIN, env={"RAY_ADDRESS": "127.0.0.1:1"}, timeout_s=90,
         setup=good_images),
    Case("bench: RAY_ADDRESS that does not resolve", argv=["datapipe", "bench", IMAGES, "--backends", "ray"],
         env={"RAY_ADDRESS": "head.invalid:6379"}, timeout_s=90),
    Case("convert: --ray-address with terminal escapes", argv=["datapipe", "convert", IMAGES, "{tmp}/c.wds", "--engine",
         "ray", "--ray-address", "\x1b[2J\x1b[31mhead:6379"], timeout_s=90),
    Case("convert: --ray-address without a port", argv=["datapipe", "convert", IMAGES, "{tmp}/c.wds", "--engine", "ray",
         "--ray-address", "head"], timeout_s=90),
    Case("convert: RAY_ADDRESS ray:// where nothing listens", argv=["datapipe", "convert", IMAGES, "{tmp}/c.wds",
         "--engine", "ray"], env={"RAY_ADDRESS": "ray://127.0.0.1:1"}, timeout_s=90),
    Case("train: RAY_ADDRESS=auto and no cluster here", argv=TINY_TRAIN, env={"RAY_ADDRESS": "auto"}, timeout_s=90,
         setup=good_images),
    Case("doctor --ray: a port 99999", argv=["datapipe", "doctor", "--ray", "127.0.0.1:99999"], expect="ok",
         timeout_s=90),
    Case("join: a port that speaks HTTP, not Ray", code=NOT_RAY, env=LOOPBACK, timeout_s=60),
    Case("join: a black-holed port (full backlog)", code=BLACK_HOLE, env=LOOPBACK, timeout_s=60),
    Case("join: a canary as RAY_AUTH_TOKEN, nothing listening", argv=["datapipe", "doctor", "--ray", "127.0.0.1:1"],
         env={"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": CANARIES["GITHUB_TOKEN"]}, expect="ok", timeout_s=90),
    Case("token cluster: doctor without, with a wrong and with the right token", code=TOKEN, expect="ok", env=LOOPBACK,
         timeout_s=240),
    Case("token cluster on loopback, dialled at the machine's address", code=TOKEN, expect="ok", timeout_s=240),
    Case("token file at /dev/zero and at a FIFO, joining", code=TOKEN_FILE, expect="ok", env=LOOPBACK, timeout_s=240),
    Case("token file at /dev/zero, a local Ray", argv=TINY_TRAIN, env={"RAY_AUTH_TOKEN_PATH": "/dev/zero"},
         setup=good_images, timeout_s=120),
    Case("pool_resources 1e308 on the CLI", argv=TINY_TRAIN + ["--pool-resources", "datapipe=1e308"], timeout_s=60,
         setup=good_images),
    Case("pool_resources nan on the CLI", argv=["datapipe", "bench", IMAGES, "--backends", "ray", "--pool-resources",
         "datapipe=nan"], timeout_s=60),
    Case("pool_resources inf in make_loader", code=BAD_AMOUNT.format(fixtures="{fixtures}", amount="float('inf')"),
         timeout_s=60),
    Case("pool_resources 1e-9 in make_loader", code=BAD_AMOUNT.format(fixtures="{fixtures}", amount="1e-9"),
         timeout_s=60),
    Case("backend='ray' on a local Ray under a 4 GiB address-space cap", code=LOADER, expect="ok", timeout_s=300,
         setup=good_images),
    Case("train --backend ray on a local Ray under the cap", argv=TINY_TRAIN, expect="ok", timeout_s=400,
         setup=good_images),
    Case("convert --engine ray on a local Ray under the cap", argv=["datapipe", "convert", IMAGES, "{tmp}/c.wds",
         "--engine", "ray", "-q"], expect="ok", timeout_s=300),
]
