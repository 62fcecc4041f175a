"""The local Ray datapipe starts for itself (ray_local.start_local: backend='ray' with no Ray connected,
convert --engine ray with no address): its object store sized to what the machine lets it map, so it
starts under ulimit -v (before: Ray's default, 30% of the memory, failed after 31 s with Ray's generic
startup timeout); one that still cannot start is one line naming the cause its raylet logged; Ray's
token notice kept quiet and nothing left in the temp folder after it (before: a session folder a run)."""
from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytest.importorskip("ray")

from datapipe.ray_local import MIN_STORE, PREFIX, WORKER_ADDRESS_SPACE, Limits, LocalRayFailed, store_bytes  # noqa: E402

GIB = 1 << 30
CAP = 4 * GIB  # the adversarial harness's default address-space cap
START = """
import json, os, sys
from datapipe.ray_local import _running, read_limits, start_local, stop_local
from datapipe.ray_setup import import_ray
ray = import_ray()


def naming(folder):
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if int(pid) != os.getpid() and folder.encode() in open(f"/proc/{pid}/cmdline", "rb").read():
                found.append(pid)
        except OSError:
            pass
    return found


try:
    start_local(ray, log_to_driver=False, num_cpus=1, **json.loads(sys.argv[1]))
except Exception as exc:
    print(json.dumps({"error": f"{type(exc).__name__}: {exc}", "left": naming(sys.argv[2])}))
    sys.exit(0)
@ray.remote
def add(x):
    return x + 1
print(json.dumps({"store": ray.cluster_resources()["object_store_memory"], "eight": ray.get(add.remote(7)),
                  "folder": str(_running[0]), "mode": os.stat(_running[0]).st_mode & 0o777,
                  "limits": str(read_limits())}))
stop_local(ray)
"""


def test_the_store_fits_the_memory_shm_and_address_space():
    free = Limits(available=20 * GIB, shm_free=64 * GIB, address_space=None)
    assert store_bytes(free) == int(20 * GIB * 0.3)  # Ray's default
    assert store_bytes(Limits(20 * GIB, 1 * GIB, None)) == int(GIB * 0.95)  # /dev/shm's free space
    assert store_bytes(Limits(20 * GIB, 1 << 20, None)) == int(20 * GIB * 0.3)  # too little shm: Ray uses /tmp
    assert store_bytes(Limits(20 * GIB, 64 * GIB, CAP)) == (CAP - WORKER_ADDRESS_SPACE) // 2 == GIB
    with pytest.raises(LocalRayFailed, match=r"^a local Ray cannot start here: its object store would get 0 MiB, "
                                             r"under the 75 MiB Ray needs \(ulimit -v 2.0 GiB, .*raise ulimit -v"):
        store_bytes(Limits(20 * GIB, 64 * GIB, 2 * GIB))
    assert store_bytes(Limits(MIN_STORE / 0.3 + 10, 64 * GIB, None)) >= MIN_STORE


def start(options: dict, cap: int | None, tmp: Path) -> tuple[dict, str]:
    """start_local in a child process under `cap` bytes of address space, with a temp folder of its own."""
    def limit() -> None:
        if cap is not None:
            resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp / "home"), "TMPDIR": str(tmp / "t")}
    (tmp / "t").mkdir()
    done = subprocess.run([sys.executable, "-c", START, json.dumps(options), str(tmp / "t")], env=env,
                          capture_output=True, text=True, timeout=240, preexec_fn=limit, cwd=Path(__file__).parents[2])
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def short_folder() -> Path:
    return Path(tempfile.mkdtemp(prefix="rl", dir="/tmp"))  # Ray's socket paths must fit AF_UNIX's 107 bytes


def test_a_local_ray_starts_under_ulimit_v_and_leaves_nothing_behind():
    tmp = short_folder()
    try:
        got, stderr = start({}, CAP, tmp)
        assert got["eight"] == 8, got
        assert MIN_STORE <= got["store"] <= (CAP - WORKER_ADDRESS_SPACE) // 2 and "ulimit -v 4.0 GiB" in got["limits"]
        assert got["folder"].startswith(str(tmp / "t" / PREFIX)) and got["mode"] == 0o700  # Ray's folders are 0777
        assert list((tmp / "t").iterdir()) == []  # its session folder removed (before: TMPDIR/ray/session_*)
        assert "Token authentication is enabled" not in stderr  # Ray's notice at every start, kept quiet
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.mark.full  # ~35 s: Ray gives a node 30 s to come up; the sizing above keeps make test's starts from this
def test_a_local_ray_that_cannot_start_names_the_cause_in_one_line():
    """A store larger than ulimit -v allows (given: the sizing would not choose it): the raylet's mmap
    fails; the error names it, the processes that did start are stopped and the folder is removed."""
    tmp = short_folder()
    try:
        got, _ = start({"object_store_memory": 5 * GIB}, CAP, tmp)
        assert got["error"].startswith("LocalRayFailed: a local Ray could not start: raylet: mmap failed"), got
        assert "object store 5.0 GiB; ulimit -v 4.0 GiB" in got["error"] and "\n" not in got["error"]
        assert got["left"] == [] and list((tmp / "t").iterdir()) == []
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_a_token_file_that_is_a_fifo_is_refused_before_ray_reads_it(tmp_path, monkeypatch):
    """A Ray of its own turns token authentication on and reads the token file, blocking: a FIFO hung it."""
    import ray

    from datapipe.ray_local import start_local

    os.mkfifo(tmp_path / "fifo")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "fifo"))
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    with pytest.raises(LocalRayFailed, match=r"^a local Ray cannot start: Ray's token file .*fifo is not a token"):
        start_local(ray)
