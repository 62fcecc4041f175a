"""The trainer's and the pool's CPU per image and the bytes received per image (datapipe/bench/meter.py):
measured over the timed window with injected clocks, carried to the table and the JSON; the pool
meters on real threads and processes; the options that ask for backend="ray" rows. The Ray pool's
own meter runs in tests/bench/test_bench_ray_pool.py."""
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import pytest
import torch

from datapipe.bench import BenchOptions, suites
from datapipe.bench.meter import (WorkerProcesses, bytes_per_image, cpu_between, decode_threads, epoch_usage,
                                  received)
from datapipe.bench.report import document, table
from datapipe.bench.suites import Row, timed
from datapipe.cli.main import build_parser
from tests.processes import deadline


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
    rows = [Row("d", "lmdb", "pipeline", "threads", 500.0, runs=[500.0], trainer_cpu_ms_per_image=2.5,
                pool_cpu_ms_per_image=2.25),
            Row("d", "lmdb", "pipeline", "ray p=2", 400.0, 400.0 * 150_544 / 1e6, runs=[400.0],
                trainer_cpu_ms_per_image=0.57, pool_cpu_ms_per_image=2.63, bytes_per_image=150_544.0),
            Row("d", "lmdb", "pipeline", "dali", 300.0, runs=[300.0], trainer_cpu_ms_per_image=3.0)]
    lines = table(rows).splitlines()
    assert lines[0].endswith("KB/img trainer cpu ms/img pool cpu ms/img")
    assert lines[2].split()[-2:] == ["2.50", "2.25"] and lines[3].split()[-3:] == ["150.5", "0.57", "2.63"]
    assert lines[3].split()[-4] == "60.2"  # MB/s: the network rate the pool needs at 400 img/s
    pool_column = lines[0].index("pool cpu ms/img")
    assert lines[4].split()[-1] == "3.00" and len(lines[4]) <= pool_column  # DALI's pool: not measured, blank
    results = document(rows, {}, {})["results"]
    assert results[1]["bytes_per_image"] == 150_544.0 and results[1]["trainer_cpu_ms_per_image"] == 0.57
    assert results[1]["pool_cpu_ms_per_image"] == 2.63 and results[2]["pool_cpu_ms_per_image"] is None
    assert results[0]["bytes_per_image"] is None


def test_only_loader_rows_report_the_trainer_and_pool_cpu():
    case = suites.Case("d", "lmdb", "decode", "pil-1-core", lambda r: None)
    timings = [suites.Timing(100.0, 0.0, 9.0, 7.0)]
    assert case.row(timings, BenchOptions()).trainer_cpu_ms_per_image is None
    assert case.row(timings, BenchOptions()).pool_cpu_ms_per_image is None
    case.suite = "pipeline"
    assert case.row(timings, BenchOptions()).trainer_cpu_ms_per_image == 9.0
    assert case.row(timings, BenchOptions()).pool_cpu_ms_per_image == 7.0
    timings.append(suites.Timing(100.0, 0.0, 9.0, None))  # one run without a pool reading: no pool figure
    assert case.row(timings, BenchOptions()).pool_cpu_ms_per_image is None


def test_the_window_reads_the_pool_over_every_batch_it_received():
    """The pool meter starts after the warm-up and stops after the window's last batch: 30 batches,
    2 warm-up, so 28 x 10 images, at 5 ms of pool CPU a batch (0.5 ms an image)."""
    pool_cpu, calls = [0.0], []

    def batches(_):
        for _ in range(30):
            pool_cpu[0] += 0.005
            yield [0] * 10

    def meter():
        calls.append("start")
        before = pool_cpu[0]
        return lambda: calls.append("stop") or pool_cpu[0] - before

    now = [0.0]
    clock = lambda: now.__setitem__(0, now[0] + 0.001) or now[0]  # noqa: E731
    result = timed(batches, len, BenchOptions(seconds=60, warmup=2), torch.device("cpu"), step=False, clock=clock,
                   pool=meter)(0)
    assert calls == ["start", "stop"] and result.pool_cpu_ms_per_image == pytest.approx(0.5)
    assert result.batches == 26 and result.ended  # the rate's window: less the 2 drained


def test_cpu_between_readings():
    assert cpu_between({1: 1.0, 2: 2.0}, {1: 1.5, 2: 3.0, 3: 0.25}) == pytest.approx(1.75)  # 3 started in between
    assert cpu_between({1: 1.0, 2: 2.0}, {1: 1.5}) is None  # 2 ended: its seconds since are unknown
    assert cpu_between({}, {}) is None and cpu_between(None, {1: 1.0}) is None  # no pool, or no reading


def _spin(seconds: float) -> None:
    start = time.thread_time()
    while time.thread_time() - start < seconds:
        pass


@pytest.mark.parametrize("started", ["before", "after"])
def test_decode_threads_are_measured_also_once_they_ended(started):
    """The threads backend ends its decode threads at the end of an epoch, before the window's last
    reading (and with --warmup 0 starts them after its first): their CPU counts all the same, the
    trainer's own thread's does not."""
    gate = threading.Event()
    workers = [threading.Thread(target=lambda: (gate.wait(), _spin(0.2)), name=f"bench-test-decode-{k}")
               for k in range(2)]
    if started == "before":
        for w in workers:
            w.start()
    stop = decode_threads("bench-test-decode")()
    if started == "after":
        for w in workers:
            w.start()
    gate.set()
    _spin(0.1)  # the trainer's own work: not the pool's
    for w in workers:
        w.join()
    assert stop() == pytest.approx(0.4, abs=0.05)


def test_worker_processes_leave_out_the_ones_there_before():
    """A DataLoader row's pool: the processes its loader starts, not those there before it (a local Ray's
    daemons): an older process spinning all along adds nothing; a worker spinning 0.3 CPU-s counts."""
    spin = "import time\nt = time.process_time()\nwhile time.process_time() - t < {}: pass\nprint('done', flush=True)\n"
    meter = WorkerProcesses()
    with deadline(120):
        older = subprocess.Popen([sys.executable, "-c", spin.format(30)])
        try:
            meter.mark()
            stop = meter()
            worker = subprocess.Popen([sys.executable, "-c", spin.format(0.3) + "time.sleep(60)"],
                                      stdout=subprocess.PIPE, text=True)
            try:
                assert worker.stdout.readline() == "done\n"
                seconds = stop()
            finally:
                worker.kill()
                worker.wait()
        finally:
            older.kill()
            older.wait()
    assert seconds is not None and 0.3 <= seconds < 0.6  # its start-up included


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
