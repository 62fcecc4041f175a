"""`datapipe bench --backend ray` and `datapipe doctor --ray` on one loopback Ray for the module (2 CPUs
offering the `datapipe` resource): a row per pool size with the bytes received per image and the
trainer's CPU per image; doctor describing the cluster, in this process and from the CLI, and leaving
it running."""
import os
import subprocess
import sys
import time

import pytest

ray = pytest.importorskip("ray")

from datapipe.bench import BenchOptions, run_bench  # noqa: E402
from datapipe.bench.report import table  # noqa: E402
from datapipe.doctor.cluster import ray_checks  # noqa: E402
from datapipe.ray_setup import loopback_only  # noqa: E402

RELEASE_S = 60  # a closed pool's actors give their CPUs back within this


@pytest.fixture(scope="module")
def local_ray(ray_home):
    with pytest.MonkeyPatch.context() as env:
        env.setenv("HOME", str(ray_home))  # Ray's auth token goes under ~/.ray (tests/conftest.py)
        with loopback_only():  # 127.0.0.1 only: Ray on Linux otherwise listens on every interface
            ray.init(num_cpus=2, resources={"datapipe": 2}, _node_ip_address="127.0.0.1", include_dashboard=False,
                     object_store_memory=80 << 20, _temp_dir=str(ray_home / "tools"), logging_level="WARNING",
                     log_to_driver=False)
        try:
            yield ray
        finally:
            ray.shutdown()


def test_bench_runs_the_pool_at_each_size(local_ray, packed_lmdb, within):
    options = BenchOptions(backends=("ray",), batch_size=4, image_size=32, seconds=0.5, repeats=1, warmup=1,
                           workers=1, pool_workers=(1, 2), pool_resources=(("datapipe", 1),),
                           min_batches=1)  # the 27-record fixture: no throughput, the columns are what is tested
    rows = run_bench([packed_lmdb], options, suites=("pipeline",))
    assert [r.backend for r in rows] == ["ray p=1", "ray p=2"] and all(not r.note for r in rows)
    for r in rows:  # a received batch: uint8 pixels, int64 labels and indices
        assert r.bytes_per_image == 32 * 32 * 3 + 8 + 8
        assert r.mb_per_s == pytest.approx(r.images_per_s * r.bytes_per_image / 1e6)
        assert r.trainer_cpu_ms_per_image > 0 and r.images_per_s > 0
    assert rows[0].knobs == {"pool_workers": "1", "backend": "ray"} and rows[1].knobs == {"pool_workers": "2"}
    assert "ray p=2" in table(rows) and "3.1" in table(rows)  # KB/img
    assert ray.is_initialized()  # the bench leaves the Ray it found running
    deadline = time.monotonic() + RELEASE_S  # every run closed its loader: no actor holds a CPU
    while ray.available_resources().get("CPU", 0) < 2:
        assert time.monotonic() < deadline, f"pool actors still hold CPUs: {ray.available_resources()}"
        time.sleep(0.2)


def test_doctor_describes_the_cluster_it_is_connected_to(local_ray):
    checks = {c.name: c for c in ray_checks(None)}
    assert checks["ray_cluster"].value == "1 node alive (0 dead): 2 CPUs, 0 GPUs, datapipe: 2"
    assert checks["ray_node0"].value.endswith(": 2 CPUs, 0 GPUs, datapipe: 2")  # the node's address first
    assert "no GPUs in the cluster" in checks["pool_cores"].value and "hold 2" in checks["pool_cores"].value
    assert ray.is_initialized()


def test_doctor_cli_joins_a_running_cluster_and_leaves_it_running(local_ray, ray_home, within):
    address = ray.get_runtime_context().gcs_address
    # a loopback cluster: without the switch, Ray in the child rewrites 127.0.0.1 to the machine's address
    env = {**os.environ, "HOME": str(ray_home), "RAY_ADDRESS": address, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    done = subprocess.run([sys.executable, "-m", "datapipe", "doctor", "--images-per-s", "24000"], env=env,
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = {ln.split()[1]: ln for ln in done.stdout.splitlines() if ln[:5] in ("  ok ", "WARN ", "info ")}
    assert "1 node alive" in lines["ray_cluster"] and "datapipe: 2" in lines["ray_node0"]
    assert "~85 pool cores for 24,000 img/s (given" in lines["pool_cores"] and lines["pool_cores"].startswith("WARN")
    assert "3.61 GB/s" in lines["pool_network"]
    assert ray.get(ray.put(7)) == 7 and len(ray.nodes()) == 1  # the cluster runs on; no node was added
