"""The pool's sizing arithmetic (datapipe/pool_sizing.py) and doctor's cluster section without a cluster:
node dicts as ray.nodes() gives them, Ray absent, a head that does not answer (one line, in seconds).
A live cluster: tests/test_ray_tools.py."""
import pickle
import subprocess
import sys

import pytest

from datapipe.doctor import cluster as doctor_cluster
from datapipe.augment.plan import plan_sample
from datapipe.augment.recipe import resolve_recipe
from datapipe.doctor.cluster import SizingOptions, cluster_checks, ray_checks
from datapipe.pool_sizing import PLAN_BYTES, pool_cores, wire, wire_lines


def test_pool_cores_for_eight_h100_on_deit():
    """docs/clusters.md's figure: 24,000 img/s x 2.82 CPU-ms/img at 80% use of a core."""
    assert pool_cores(24_000, 2.82e-3, 0.8) == pytest.approx(84.6)
    assert pool_cores(24_000, 2.41e-3, 1.0) == pytest.approx(57.84)
    with pytest.raises(ValueError, match="utilisation must be"):
        pool_cores(1000, 1e-3, 0)


def test_wire_rates_and_break_even():
    w = wire(24_000, image_size=224, jpeg_bytes=110_000, link_gbit=100, plan_bytes=512)
    assert w.uint8_bytes == 150_528 and w.jpeg_bytes == 110_512
    assert w.uint8_rate == pytest.approx(3.612672e9) and w.jpeg_rate == pytest.approx(2.652288e9)
    assert w.uint8_max_images_per_s == pytest.approx(12.5e9 / 150_528)
    assert w.choice == "uint8"
    assert wire(24_000, link_gbit=25).choice == "jpeg"  # 3.6 GB/s of pixels on a 3.1 GB/s link
    assert wire(24_000, link_gbit=10).choice == "neither"
    first, fills, verdict = wire_lines(wire(24_000, link_gbit=25))
    assert "3.61 GB/s (28.9 Gbit/s), 116% of the link" in first and "JPEG" in verdict
    with pytest.raises(ValueError, match="image_size must be >= 1"):
        wire(1000, image_size=0)
    with pytest.raises(ValueError, match="link_gbit must be"):
        wire(1000, link_gbit=0)


def test_a_plan_fits_the_bytes_the_sizing_counts_for_it():
    recipe = resolve_recipe("deit")
    assert max(len(pickle.dumps(plan_sample(recipe, 0, 0, k, 224, 500, 375))) for k in range(100)) <= PLAN_BYTES


NODES = [
    {"Alive": True, "NodeManagerAddress": "10.0.0.1",
     "Resources": {"CPU": 96.0, "GPU": 8.0, "memory": 1e12, "node:10.0.0.1": 1.0, "accelerator_type:H100": 1.0}},
    {"Alive": True, "NodeManagerAddress": "10.0.0.2", "Resources": {"CPU": 64.0, "datapipe": 64.0, "memory": 1e11}},
    {"Alive": True, "NodeManagerAddress": "10.0.0.3", "Resources": {"CPU": 32.0, "datapipe": 48.0}},
    {"Alive": False, "NodeManagerAddress": "10.0.0.4", "Resources": {"CPU": 64.0, "datapipe": 64.0}},
]


def test_cluster_section_from_ray_nodes():
    checks = {c.name: c for c in cluster_checks(NODES)}
    assert checks["ray_cluster"].value == "3 nodes alive (1 dead): 192 CPUs, 8 GPUs, datapipe: 112"
    assert checks["ray_node0"].value == "10.0.0.1: 96 CPUs, 8 GPUs"  # Ray's own entries left out
    assert checks["ray_node1"].value == "10.0.0.2: 64 CPUs, 0 GPUs, datapipe: 64"
    assert "ray_node3" not in checks
    cores = checks["pool_cores"]  # 8 GPUs x 3,000 img/s; the pool holds min(CPU, datapipe) a node: 64 + 32
    assert "~85 pool cores for 24,000 img/s" in cores.value and "hold 96" in cores.value and cores.status == "ok"
    assert checks["pool_network"].status == "ok" and "29% of the link" in checks["pool_network"].value
    small = {c.name: c for c in cluster_checks(NODES, SizingOptions(images_per_s=28_000, link_gbit=25))}
    assert small["pool_cores"].status == "warn" and small["pool_network"].status == "warn"
    assert "decode on the GPU" in small["pool_network"].hint


def test_a_cluster_without_the_pool_resource_says_how_to_add_it():
    checks = {c.name: c for c in cluster_checks(NODES[:1])}
    assert checks["ray_cluster"].status == "info" and "--resources='{\"datapipe\": N}'" in checks["ray_cluster"].hint
    assert "8 GPU(s) x 3,000 img/s" in checks["pool_cores"].value and checks["pool_cores"].status == "warn"


def test_a_cluster_without_gpus_is_not_sized_for_a_gpu_it_does_not_have():
    """Before: '1 GPU(s) x 3,000 img/s' on a 0-GPU cluster. Now it asks for the rate; a rate given sizes it."""
    cpus = [n for n in NODES if n["Resources"].get("GPU", 0) == 0]
    checks = {c.name: c for c in cluster_checks(cpus)}
    cores = checks["pool_cores"]
    assert "GPU(s) x" not in cores.value and "no GPUs in the cluster" in cores.value and "hold 96" in cores.value
    assert cores.status == "info" and "--images-per-s" in cores.hint and "pool_network" not in checks
    given = {c.name: c for c in cluster_checks(cpus, SizingOptions(images_per_s=6000))}
    assert "for 6,000 img/s (given" in given["pool_cores"].value and "pool_network" in given


def test_without_ray_or_an_address_doctor_says_so_in_one_line(monkeypatch):
    monkeypatch.setattr(doctor_cluster, "ray_version", lambda: None)
    [absent] = ray_checks("head:6379")
    assert absent.status == "warn" and "not installed" in absent.value and not absent.hint
    monkeypatch.undo()
    if doctor_cluster.ray_version() is None:
        pytest.skip("Ray is not installed")
    if "ray" in sys.modules and sys.modules["ray"].is_initialized():
        pytest.skip("this process is connected to a Ray")
    [idle] = ray_checks(None)
    assert idle.status == "info" and "--ray" in idle.value


def test_an_unreachable_head_is_one_line_not_a_traceback():
    pytest.importorskip("ray")
    done = subprocess.run([sys.executable, "-m", "datapipe", "doctor", "--ray", "127.0.0.1:1"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    [line] = [ln for ln in done.stdout.splitlines() if "ray_cluster" in ln]
    assert "unreachable: cannot join the Ray cluster at 127.0.0.1:1" in line and "nothing answers there" in line
    assert "Traceback" not in done.stderr and "Traceback" not in done.stdout
    if not sys.modules["ray"].is_initialized():
        [bad] = ray_checks("nohost")
        assert bad.status == "warn" and "'nohost' is not a Ray address: give HOST:PORT" in bad.value


def test_which_cluster_doctor_asks_for(monkeypatch):
    """--ray HOST:PORT, else RAY_ADDRESS, else --ray alone ('auto'); neither: none (one info line)."""
    from datapipe.cli import doctor as cli_doctor
    from datapipe.cli.main import build_parser

    asked = []
    monkeypatch.setattr(doctor_cluster, "ray_checks", lambda address, sizing: asked.append((address, sizing)) or [])

    def address(*argv, env=None):
        cli_doctor.cluster_checks(build_parser().parse_args(["doctor", *argv]), env or {})
        return asked[-1][0]

    assert address() is None and address("--ray") == "auto"
    assert address(env={"RAY_ADDRESS": "h:1"}) == "h:1" and address("--ray", env={"RAY_ADDRESS": "h:1"}) == "h:1"
    assert address("--ray", "x:2", env={"RAY_ADDRESS": "h:1"}) == "x:2"
    address("--jpeg-kb", "40", "--link-gbit", "25", "--images-per-s", "9000")
    assert asked[-1][1] == SizingOptions(images_per_s=9000, jpeg_bytes=40_000, link_gbit=25)
