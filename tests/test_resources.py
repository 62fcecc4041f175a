"""One rule for CPUs per rank: affinity, cgroup quota, ranks on the node; used by every consumer."""
import pytest

from datapipe import make_loader
from datapipe.resources import available_cpus, cgroup_cpu_limit, cpus_per_rank, local_world_size


@pytest.fixture
def node_of_224_cpus(monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(224)))


def test_cgroup_quota_v2_and_v1(tmp_path):
    (tmp_path / "v2").mkdir()
    (tmp_path / "v2" / "cpu.max").write_text("3200000 100000\n")
    assert cgroup_cpu_limit(tmp_path / "v2") == 32
    (tmp_path / "v2" / "cpu.max").write_text("max 100000\n")
    assert cgroup_cpu_limit(tmp_path / "v2") is None
    (tmp_path / "v1" / "cpu").mkdir(parents=True)
    (tmp_path / "v1" / "cpu" / "cpu.cfs_quota_us").write_text("150000")
    (tmp_path / "v1" / "cpu" / "cpu.cfs_period_us").write_text("100000")
    assert cgroup_cpu_limit(tmp_path / "v1") == 1.5
    assert cgroup_cpu_limit(tmp_path / "none") is None


def test_cpus_per_rank_divides_the_quota_or_affinity_by_the_local_ranks(tmp_path, node_of_224_cpus):
    assert available_cpus(tmp_path) == 224
    assert cpus_per_rank({"LOCAL_WORLD_SIZE": "8"}, tmp_path) == 28
    (tmp_path / "cpu.max").write_text("6400000 100000")  # a container limited to 64 CPUs
    assert available_cpus(tmp_path) == 64 and cpus_per_rank({"LOCAL_WORLD_SIZE": "8"}, tmp_path) == 8
    assert cpus_per_rank({"LOCAL_WORLD_SIZE": "300"}, tmp_path) == 1
    assert local_world_size({}) == 1 and local_world_size({"LOCAL_WORLD_SIZE": "x"}) == 1


@pytest.mark.parametrize("backend", ["dataloader", "dali"])
def test_loaders_default_to_the_rank_share(packed_lmdb, backend, monkeypatch, node_of_224_cpus):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    loader = make_loader(packed_lmdb, backend=backend, batch_size=4)
    share = cpus_per_rank()
    assert share == max(1, available_cpus() // 8)  # 28 unless a cgroup quota caps it
    if backend == "dataloader":
        assert loader.loader.num_workers == share
    else:  # on CUDA the GPU decodes: DALI's threads are capped (thread_budget), its source workers keep half
        from datapipe.backends.dali.graph import thread_budget

        assert (loader.threads, loader.py_workers) == thread_budget(share, cuda=loader.device.type == "cuda")
        assert loader.device.type == "cuda" or loader.threads == share
