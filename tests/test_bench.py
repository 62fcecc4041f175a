"""`datapipe bench` and `datapipe doctor` on a machine without CUDA: the wait column, the timing window,
the tools, bad options, the progress bar, doctor's hints. The command line's JSON, plot and table on data
long enough to time: tests/bench/test_bench_cli.py."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from datapipe.bench import BenchOptions, run_bench
from datapipe.bench.suites import timed
from datapipe.bench.report import table
from datapipe.doctor.pipeline import diagnose
from datapipe.augment.view import region_decoder_available


def run(*args):
    return subprocess.run([sys.executable, "-m", "datapipe", *map(str, args)], capture_output=True, text=True,
                          timeout=600)


def test_simulated_step_reports_data_wait(packed_lmdb):
    rows = run_bench([packed_lmdb], BenchOptions(backends=("dataloader",), batch_size=4, image_size=32, seconds=60,
                                                 repeats=1, warmup=1, workers=1, simulate_step_ms=20,
                                                 min_batches=1),  # the column, not the figure: a short fixture
                     suites=("pipeline",))
    assert 0 <= rows[0].data_wait_pct < 100
    assert "wait%" in table(rows)


def test_timing_window_leaves_out_the_free_drain_of_a_look_ahead_loader():
    """A loader that made its last 2 batches ahead of time hands them out instantly at the end of
    the epoch; counting them would read as ~8% faster than the 10 images per 10 ms it delivers.
    A fake clock: no test depends on how fast this machine is."""
    now = [0.0]

    def batches(_):
        for i in range(30):
            if i < 28:
                now[0] += 0.01
            yield [0] * 10

    rate = timed(batches, len, BenchOptions(seconds=60, warmup=2), torch.device("cpu"), step=False,
                 clock=lambda: now[0])(0).images_per_s
    assert rate == pytest.approx(1000)


def test_ab_loader_tool_reports_both_sides(packed_lmdb):
    tool = Path(__file__).resolve().parents[1] / "tools" / "ab_loader.py"
    done = subprocess.run([sys.executable, tool, packed_lmdb, "--b-env", "DATAPIPE_REGION_DECODE=0", "--runs", "1",
                           "--epochs", "1", "--batch-size", "4", "--image-size", "32", "--workers", "1"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "B: dataloader, workers=1 DATAPIPE_REGION_DECODE=0" in done.stdout and "B / A: " in done.stdout
    for side in ("A", "B"):
        line = next(l for l in done.stdout.splitlines() if l.startswith(f"{side}: ") and "img/s" in l)
        assert float(line.split()[1]) > 0 and "workers" in line


def test_bench_rejects_bad_options(packed_lmdb):
    with pytest.raises(ValueError, match="unknown backends"):
        BenchOptions(backends=("turbo",))
    with pytest.raises(ValueError, match="unknown suites"):
        run_bench([packed_lmdb], BenchOptions(), suites=("everything",))


def test_doctor_without_cuda(clean_folder):
    checks = {c.name: c for c in diagnose(clean_folder, {"OMP_NUM_THREADS": "512"})}
    assert checks["gpu"].status == "info" and "no CUDA GPU" in checks["gpu"].hint
    assert checks["dali"].value != "not installed"
    assert checks["OMP_NUM_THREADS"].status == "warn" and "oversubscribe" in checks["OMP_NUM_THREADS"].hint
    assert "MB/s" in checks["read_speed"].value and "GB" in checks["disk_free"].value
    assert "default num_workers" in checks["cores"].value and checks["dali_build"].status == "info"
    assert checks["jpeg_region_decoder"].value == ("in use" if region_decoder_available() else "not in use")


def test_doctor_names_the_dali_build_that_matches_torch():
    from datapipe.doctor.pipeline import dali_build_check

    assert dali_build_check(["nvidia-dali-cuda130"], "13.0").status == "ok"
    wrong = dali_build_check(["nvidia-dali-cuda120"], "13.0")
    assert wrong.status == "warn" and "datapipe[dali-cu13]" in wrong.hint
    assert "datapipe[dali-cu12]" in dali_build_check(["nvidia-dali-cuda130"], "12.8").hint


def test_doctor_names_a_missing_data_path(tmp_path):
    checks = {c.name: c for c in diagnose(tmp_path / "missing", {})}
    assert checks["data"].status == "warn" and "does not exist" in checks["data"].hint


def test_doctor_cli_json(clean_folder):
    done = run("doctor", clean_folder, "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert {c["name"] for c in doc["checks"]} >= {"torch", "cuda", "dali", "cores", "read_speed"}
    assert doc["machine"]["cores"] >= 1


def test_node_memory_tool_measures_ranks_and_workers(tmp_path):
    """tools/node_memory.py end to end at a tiny scale: one row per format/backend/start method."""
    out = tmp_path / "rows.json"
    done = subprocess.run([sys.executable, "tools/node_memory.py", "--out", str(tmp_path / "data"), "--records", "1500",
                           "--small", "500", "--formats", "wds", "--backends", "dataloader", "--start-methods", "fork",
                           "--ranks", "2", "--workers", "1", "--batches", "2", "--json", str(out)],
                          cwd=Path(__file__).parents[1], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    (row,) = json.loads(out.read_text())
    assert row["format"] == "wds" and row["records"] == 1500 and row["node_pss_mb"] > 0
    assert isinstance(row["rank_private_b_per_record"], float) and isinstance(row["worker_private_b_per_record"], float)


def test_one_progress_bar_instead_of_a_log_line_per_run(packed_lmdb, capsys, caplog):
    caplog.set_level("INFO")
    options = BenchOptions(backends=("threads",), batch_size=4, image_size=32, seconds=0.2, repeats=2, warmup=0,
                           workers=1)
    run_bench([packed_lmdb], options, suites=("read", "pipeline"), progress=True)
    bar = capsys.readouterr().err
    assert "bench: 100%" in bar and "4/4" in bar and "pipeline threads" in bar
    assert "bench repeat" not in caplog.text
