"""The trainer's CPU per image and the bytes received per image (datapipe/bench/meter.py): measured
over the timed window with injected clocks, carried to the table and the JSON, and the options that
ask for backend="ray" rows. No Ray here: tests/test_ray_tools.py runs the pool."""
from types import SimpleNamespace

import pytest
import torch

from datapipe.bench import BenchOptions, suites
from datapipe.bench.meter import bytes_per_image, epoch_usage, received
from datapipe.bench.report import document, table
from datapipe.bench.suites import Row, timed
from datapipe.cli import build_parser


def test_the_window_counts_this_process_cpu_per_image_and_leaves_out_the_drain():
    """30 batches of 10 images, each 10 ms of wall and 2 ms of CPU, but the last 2 (made ahead) free:
    2 warm-up batches out, 2 drained out, so 26 batches in the window at 2 ms / 10 images."""
    now, cpu = [0.0], [0.0]
    closed = []

    def batches(_):
        try:
            for i in range(30):
                if i < 28:
                    now[0] += 0.01
                    cpu[0] += 0.002
                yield [0] * 10
        finally:
            closed.append(True)

    result = timed(batches, len, BenchOptions(seconds=60, warmup=2), torch.device("cpu"), step=False,
                   clock=lambda: now[0], cpu=lambda: cpu[0])(0)
    assert result.images_per_s == pytest.approx(1000) and result.cpu_ms_per_image == pytest.approx(0.2)
    assert closed == [True]


def test_a_window_cut_by_the_clock_closes_its_batches():
    """`seconds` passed mid-epoch: the batches' generator is closed (a ray loader is closed in its finally)."""
    now, closed = [0.0], []

    def batches(_):
        try:
            while True:
                now[0] += 1.0
                yield [0]
        finally:
            closed.append(True)

    timed(batches, len, BenchOptions(seconds=5, warmup=0), torch.device("cpu"), step=False, clock=lambda: now[0])(0)
    assert closed == [True]


def test_table_and_json_carry_cpu_and_bytes_per_image():
    rows = [Row("d", "lmdb", "pipeline", "threads", 500.0, runs=[500.0], trainer_cpu_ms_per_image=2.5),
            Row("d", "lmdb", "pipeline", "ray p=2", 400.0, 400.0 * 150_544 / 1e6, runs=[400.0],
                trainer_cpu_ms_per_image=0.57, bytes_per_image=150_544.0)]
    lines = table(rows).splitlines()
    assert lines[0].split()[-3:] == ["KB/img", "cpu", "ms/img"]
    assert lines[2].split()[-1] == "2.50" and lines[3].split()[-2:] == ["150.5", "0.57"]
    assert lines[3].split()[-3] == "60.2"  # MB/s: the network rate the pool needs at 400 img/s
    results = document(rows, {}, {})["results"]
    assert results[1]["bytes_per_image"] == 150_544.0 and results[1]["trainer_cpu_ms_per_image"] == 0.57
    assert results[0]["bytes_per_image"] is None


def test_only_loader_rows_report_the_trainer_cpu():
    case = suites.Case("d", "lmdb", "decode", "pil-1-core", lambda r: None)
    timings = [suites.Timing(100.0, 0.0, 9.0)]
    assert case.row(timings, BenchOptions()).trainer_cpu_ms_per_image is None
    case.suite = "pipeline"
    assert case.row(timings, BenchOptions()).trainer_cpu_ms_per_image == 9.0


def test_received_bytes_per_image():
    assert received(object()) == (0, 0) and bytes_per_image((0, 0), (0, 0)) is None
    assert bytes_per_image((100, 1), (100 + 3 * 3088, 4)) == 3088

    class Loader:  # a pool loader: each batch of 4 received is 4 x 3,088 bytes
        received_bytes = received_images = 0

        def set_epoch(self, epoch):
            self.epoch = epoch

        def __iter__(self):
            for _ in range(3):
                self.received_bytes += 4 * 3088
                self.received_images += 4
                yield SimpleNamespace(indices=[0, 1, 2, 3])

    usage = epoch_usage(Loader(), 1)
    assert usage.images == 12 and usage.bytes_per_image == 3088
    assert set(usage.as_dict()) >= {"images_per_s", "trainer_cpu_ms_per_image", "cpu_s", "wall_s"}


def test_ray_is_a_bench_backend_with_pool_sizes():
    options = BenchOptions(backends=("threads", "ray"), pool_workers=(1, 2))
    assert options.pool_workers == (1, 2)
    with pytest.raises(ValueError, match="pool_workers must be pool sizes >= 1"):
        BenchOptions(backends=("ray",), pool_workers=(0,))
    args = build_parser().parse_args(["bench", "d", "--backend", "ray", "--pool-workers", "1,2",
                                      "--pool-resources", "datapipe=1"])
    assert args.backends == "ray" and args.pool_workers == (1, 2) and args.pool_resources == (("datapipe", 1.0),)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "d", "--pool-workers", "1,x"])
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "d", "--pool-resources", "datapipe"])


def test_without_ray_the_ray_row_says_skipped(monkeypatch, packed_lmdb):
    monkeypatch.setattr(suites, "ray_installed", lambda: False)
    from datapipe.formats import open_dataset

    [case] = suites.suite_pipeline("d", open_dataset(packed_lmdb), BenchOptions(backends=("ray",)), torch.device("cpu"))
    assert case.run is None and case.note.startswith("skipped: Ray is not installed")
