"""#48 row 4: bench's ray row reports the pool's CPU per image, read from the actors themselves (each
asked its process's CPU time through Ray), beside the trainer's; the threads row's decode threads give
the same column. On a local Ray on 127.0.0.1, started and stopped by the bench."""
import pytest

pytest.importorskip("ray")

from datapipe.bench import BenchOptions, run_bench  # noqa: E402
from datapipe.bench.report import table  # noqa: E402


def test_the_ray_row_has_the_actors_cpu_per_image(long_lmdb, ray_home, monkeypatch, within):
    monkeypatch.setenv("HOME", str(ray_home))  # Ray's auth token goes under ~/.ray (tests/conftest.py)
    options = BenchOptions(backends=("threads", "ray"), batch_size=4, image_size=32, seconds=120, repeats=1,
                           warmup=1, workers=1, pool_workers=(1,))
    threads, pool = run_bench([long_lmdb], options, suites=("pipeline",))
    assert pool.backend == "ray p=1" and not pool.note and pool.batches_per_worker >= 50
    assert pool.pool_cpu_ms_per_image > 0 and pool.trainer_cpu_ms_per_image > 0
    assert threads.pool_cpu_ms_per_image > 0  # the same work on a decode thread
    assert pool.bytes_per_image == 32 * 32 * 3 + 8 + 8
    line = next(ln for ln in table([threads, pool]).splitlines() if "ray p=1" in ln)
    assert line.split()[-1] == f"{pool.pool_cpu_ms_per_image:.2f}"
