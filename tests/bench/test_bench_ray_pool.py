"""#48 row 4: bench's ray row reports the pool's CPU per image, read from the actors themselves (each
asked its process's CPU time through Ray), beside the trainer's; the threads row's decode threads give
the same column. A pool that cannot start its actors is a failed row, not the figure of the loader's
fallback under the pool's name. One loopback Ray for the module (2 CPUs)."""
import pytest

ray = pytest.importorskip("ray")

from datapipe.bench import BenchOptions, run_bench  # noqa: E402
from datapipe.bench.report import table  # noqa: E402
from datapipe.ray_setup import loopback_only  # noqa: E402


@pytest.fixture(scope="module")
def local_ray(ray_home):
    with pytest.MonkeyPatch.context() as env:
        env.setenv("HOME", str(ray_home))  # Ray's auth token goes under ~/.ray (tests/conftest.py)
        with loopback_only():
            ray.init(num_cpus=2, _node_ip_address="127.0.0.1", include_dashboard=False, object_store_memory=80 << 20,
                     _temp_dir=str(ray_home / "bench"), logging_level="WARNING", log_to_driver=False)
        try:
            yield ray
        finally:
            ray.shutdown()


OPTIONS = dict(batch_size=4, image_size=32, seconds=120, repeats=1, warmup=1, workers=1, pool_workers=(1,))


def test_the_ray_row_has_the_actors_cpu_per_image(local_ray, long_lmdb, within):
    threads, pool = run_bench([long_lmdb], BenchOptions(backends=("threads", "ray"), **OPTIONS), suites=("pipeline",))
    assert pool.backend == "ray p=1" and not pool.note and pool.batches_per_worker >= 50
    assert pool.pool_cpu_ms_per_image > 0 and pool.trainer_cpu_ms_per_image > 0
    assert threads.pool_cpu_ms_per_image > 0  # the same work on a decode thread
    assert pool.bytes_per_image == 32 * 32 * 3 + 8 + 8
    line = next(ln for ln in table([threads, pool]).splitlines() if "ray p=1" in ln)
    assert line.split()[-1] == f"{pool.pool_cpu_ms_per_image:.2f}"


def test_a_pool_that_cannot_start_is_a_failed_row(local_ray, long_lmdb, within):
    """No node has the resource the actors ask for: the loader would decode every batch itself (its
    fallback), and the row printed that rate as the pool's."""
    options = BenchOptions(backends=("ray",), pool_resources=(("nosuchthing", 1.0),), **OPTIONS)
    (row,) = run_bench([long_lmdb], options, suites=("pipeline",))
    assert row.images_per_s == 0.0 and row.note.startswith("failed: only 0 of the pool's 1 actors started in time")
    assert "nosuchthing" in row.note
