"""Joining a Ray cluster (ray_setup.join, shared by backend='ray''s CLI paths, convert --engine ray and
doctor --ray): an address where nothing listens, a name that does not resolve and a black-holed port
are one line naming the address and the fix, within the join's timeout (ray.init alone retried for
good); a cluster with Ray's token authentication (a second Ray process on loopback, RAY_AUTH_MODE=token)
is joined with its token as Ray's docs say, and refuses a process without it, or with another, in one
line (ray.init alone printed InvalidAuthToken for 20 s, then 'unreachable'); the token is never printed."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from datapipe.ray_setup import RayUnreachable, join, loopback_only  # noqa: E402

LOOPBACK = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}  # a child's Ray keeps 127.0.0.1 (else: the machine's address)
AUTH = ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")
CLI_S = 120  # a CLI run that joins nothing ends well within this (before: it never ended)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in AUTH}
    return {**env, **LOOPBACK, "HOME": str(home), **extra}


def datapipe(*argv: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "datapipe", *argv], env=env, capture_output=True, text=True,
                          timeout=CLI_S)


def one_error_line(done: subprocess.CompletedProcess, command: str) -> str:
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr + done.stdout
    [line] = done.stderr.strip().splitlines()
    assert line.startswith(f"datapipe {command}: error: cannot join the Ray cluster at ")
    return line


def test_train_bench_and_convert_refuse_a_port_where_nothing_listens_in_one_line(packed_lmdb, tmp_path):
    """Before: each hung (570 s and counting), Ray printing two warnings every 40 s."""
    address = f"127.0.0.1:{free_port()}"
    env = clean_env(tmp_path, RAY_ADDRESS=address)
    line = one_error_line(datapipe("train", str(packed_lmdb), "--backend", "ray", "--out", str(tmp_path / "t"),
                                   env=env), "train")
    assert address in line and "nothing answers there" in line and "ray start --head" in line
    line = one_error_line(datapipe("bench", str(packed_lmdb), "--backends", "ray", env=env), "bench")
    assert address in line and "nothing answers there" in line
    src = Path(__file__).resolve().parents[2] / "fixtures" / "imagefolder"
    line = one_error_line(datapipe("convert", str(src), str(tmp_path / "c.wds"), "--engine", "ray", "--ray-address",
                                   address, env=clean_env(tmp_path)), "convert")
    assert address in line and "nothing answers there" in line
    assert not (tmp_path / "c.wds.partial").exists()  # was left empty: the next run asked for --resume or --overwrite


def test_a_name_that_does_not_resolve_is_one_line(packed_lmdb, tmp_path):
    env = clean_env(tmp_path, RAY_ADDRESS="head.invalid:6379")
    line = one_error_line(datapipe("bench", str(packed_lmdb), "--backends", "ray", env=env), "bench")
    assert "the name head.invalid does not resolve" in line and "HOST:PORT" in line
    src = Path(__file__).resolve().parents[2] / "fixtures" / "imagefolder"
    line = one_error_line(datapipe("convert", str(src), str(tmp_path / "c.wds"), "--engine", "ray", env=env), "convert")
    assert "the name head.invalid does not resolve" in line


def test_a_black_holed_port_is_refused_after_the_timeout_given():
    """A listener whose backlog is full drops new connections (SYNs unanswered), as a firewall does:
    ray.init waited for good; join gives up after its timeout (injected: 1 s here, 30 s by default)."""
    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(0)
    port = hole.getsockname()[1]
    queued = []
    for _ in range(3):  # fill the backlog
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        queued.append(s)
    try:
        with loopback_only(), pytest.raises(RayUnreachable, match=rf"at 127\.0\.0\.1:{port}: no answer in 1 s"):
            join(ray, f"127.0.0.1:{port}", timeout_s=1.0)
        assert not ray.is_initialized()
    finally:
        for s in queued + [hole]:
            s.close()


def test_an_address_that_is_not_one_is_named():
    for bad in ("head", "head:", "head:99999", "\x1b[31mhead"):
        with pytest.raises(RayUnreachable, match="is not a Ray address: give HOST:PORT") as err:
            join(ray, bad, timeout_s=1.0)
        assert "\x1b" not in str(err.value)


@pytest.mark.parametrize("address", ["admin:s3cr3t/Pw@127.0.0.1:1", "ray://admin:s3cr3t/Pw@127.0.0.1:1"])
def test_an_address_with_a_password_is_refused_without_showing_it(address):
    """doctor --ray printed "the name admin:PW@127.0.0.1 does not resolve": the password, and a wrong cause."""
    from datapipe.doctor.cluster import ray_checks

    with pytest.raises(RayUnreachable, match="carries a user or password") as err:
        join(ray, address, timeout_s=1.0)
    [check] = ray_checks(address)
    for text in (str(err.value), str(check.value)):
        assert "s3cr3t" not in text and "Pw" not in text and "127.0.0.1:1" in text


HEAD = """
import sys, ray
from datapipe.ray_setup import loopback_only
with loopback_only():
    ray.init(num_cpus=1, object_store_memory=80 << 20, _node_ip_address="127.0.0.1", include_dashboard=False,
             _temp_dir=sys.argv[1], logging_level="ERROR")
print(ray.get_runtime_context().gcs_address, flush=True)
sys.stdin.readline()
ray.shutdown()
"""

JOIN = """
import ray
from datapipe.ray_setup import RayUnreachable, import_ray, join
try:
    join(import_ray(), {address!r}, timeout_s=20)
    print("joined", int(ray.cluster_resources()["CPU"]))
    ray.shutdown()
except RayUnreachable as exc:
    print("refused", exc)
"""


@pytest.fixture(scope="module")
def token_cluster():
    """(address, its token, its HOME): a Ray of one CPU in another process, RAY_AUTH_MODE=token, on 127.0.0.1."""
    root = Path(tempfile.mkdtemp(prefix="rj", dir="/tmp"))  # short: Ray's socket paths
    (root / "home").mkdir()
    env = clean_env(root / "home", RAY_AUTH_MODE="token")
    head = subprocess.Popen([sys.executable, "-c", HEAD, str(root / "t")], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        address = head.stdout.readline().strip()
        assert address.startswith("127.0.0.1:"), address
        yield address, (root / "home" / ".ray" / "auth_token").read_text().strip(), root / "home"
    finally:
        head.stdin.close()
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, 9)
            head.wait()
        shutil.rmtree(root, ignore_errors=True)


def joined(address: str, home: Path, **auth: str) -> str:
    done = subprocess.run([sys.executable, "-c", JOIN.format(address=address)], env=clean_env(home, **auth),
                          capture_output=True, text=True, timeout=CLI_S)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    return done.stdout + done.stderr


def test_a_token_cluster_is_joined_as_rays_docs_say(token_cluster, tmp_path):
    """RAY_AUTH_MODE=token and the token: in RAY_AUTH_TOKEN, in a file RAY_AUTH_TOKEN_PATH names, or in
    ~/.ray/auth_token. The token is never printed."""
    address, token, home = token_cluster
    (tmp_path / "token").write_text(token)
    for auth, where in ((dict(RAY_AUTH_TOKEN=token), tmp_path), (dict(RAY_AUTH_TOKEN_PATH=str(tmp_path / "token")), tmp_path),
                        ({}, home)):
        out = joined(address, where, RAY_AUTH_MODE="token", **auth)
        assert "joined 1" in out and token not in out, out[-2000:]
        assert "InvalidAuthToken" not in out and "Token authentication is enabled" not in out


def test_a_token_cluster_refuses_in_one_line_naming_the_cause(token_cluster, tmp_path):
    address, token, _ = token_cluster
    out = joined(address, tmp_path)  # no RAY_AUTH_MODE: Ray sends no token
    assert out.startswith("refused cannot join the Ray cluster at") and "uses token authentication" in out
    assert "RAY_AUTH_MODE=token" in out and "InvalidAuthToken" not in out and out.count("\n") == 1
    out = joined(address, tmp_path, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN="0" * 32)
    assert "it refused this process's token" in out and "0" * 32 not in out and out.count("\n") == 1
    out = joined(address, tmp_path, RAY_AUTH_MODE="token")  # nothing in ~/.ray either
    assert "RAY_AUTH_MODE=token but this process has no token" in out and out.count("\n") == 1
    assert token not in out


def test_doctor_and_train_name_the_token_in_one_line(token_cluster, packed_lmdb, tmp_path):
    """Before: 20 lines of InvalidAuthToken over 20 s, then 'unreachable' (doctor) or a traceback."""
    address, token, _ = token_cluster
    done = datapipe("doctor", "--ray", address, env=clean_env(tmp_path))
    [line] = [ln for ln in done.stdout.splitlines() if "ray_cluster" in ln]
    assert "uses token authentication" in line and "InvalidAuthToken" not in done.stdout + done.stderr
    env = clean_env(tmp_path, RAY_ADDRESS=address)
    line = one_error_line(datapipe("train", str(packed_lmdb), "--backend", "ray", "--out", str(tmp_path / "t"),
                                   env=env), "train")
    assert "uses token authentication" in line and token not in line


def test_a_token_file_that_is_a_fifo_or_a_device_is_one_line(token_cluster, tmp_path):
    """Ray's loader reads the token file whole and blocking: a FIFO hung the join for good, /dev/zero
    filled memory until the process was killed."""
    address, _, _ = token_cluster
    os.mkfifo(tmp_path / "fifo")
    for path in (tmp_path / "fifo", Path("/dev/zero")):
        out = joined(address, tmp_path, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(path))
        assert f"Ray's token file {path} is not a token (a regular file of at most 64 KiB)" in out, out[-2000:]
