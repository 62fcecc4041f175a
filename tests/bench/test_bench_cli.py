"""`datapipe bench` from the command line on a machine without CUDA: the JSON, the plot, the table and
the verdicts on data long enough to time (tests/bench/conftest.py); a folder with bad files; and the
exit status and one line when no row produced a figure (#48 row 2)."""
import json
import shutil
import subprocess
import sys

from tests.conftest import BAD_FILES, IMAGEFOLDER

LONG = ("--batch-size", "4", "--image-size", "32", "--seconds", "120", "--warmup", "1", "--workers", "1")


def run(*args):
    return subprocess.run([sys.executable, "-m", "datapipe", *map(str, args)], capture_output=True, text=True,
                          timeout=600)


def test_bench_json_plot_and_table(long_lmdb, long_folder, tmp_path):
    out, png = tmp_path / "bench.json", tmp_path / "bench.png"
    done = run("bench", long_lmdb, long_folder, *LONG, "--repeats", "2", "--json", out, "--plot", png)
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["machine"]["cores"] >= 1 and doc["machine"]["gpu"] is None and doc["machine"]["torch"]
    rows = doc["results"]
    for row in rows:
        assert {"backend", "format", "suite", "images_per_s", "mb_per_s", "pool_cpu_ms_per_image"} <= row.keys()
    kinds = {(r["format"], r["suite"], r["backend"]) for r in rows}
    for backend in ("threads", "dataloader", "prefetch", "dali"):
        assert ("lmdb", "pipeline", backend) in kinds and ("folder", "pipeline", backend) in kinds
    assert ("lmdb", "baseline", "naive-imagefolder") in kinds and ("folder", "baseline", "plain-dali-cpu") in kinds
    assert ("lmdb", "read", "-") in kinds and ("lmdb", "decode", "pil-1-core") in kinds
    assert ("lmdb", "decode", "train-view-whole") in kinds and ("folder", "decode", "train-view-whole") in kinds
    assert all(r["images_per_s"] > 0 and len(r["runs"]) == 2 and not r["note"] for r in rows), \
        [r["note"] for r in rows]
    assert all(r["x_naive"] for r in rows if r["suite"] == "pipeline")
    assert all(r["x_naive"] is None for r in rows if r["suite"] in ("read", "decode"))  # not loaders: no ratio
    assert all(r["batches_per_worker"] >= 50 for r in rows if r["suite"] in ("baseline", "pipeline"))
    workers = {r["backend"]: r["pool_cpu_ms_per_image"] for r in rows if r["format"] == "lmdb"}
    assert workers["threads"] > 0 and workers["dataloader"] > 0 and workers["naive-imagefolder"] > 0
    assert workers["dali"] is None  # DALI's threads are not told apart: no figure, not a wrong one
    assert next(r for r in rows if r["suite"] == "read")["mb_per_s"] > 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert "naive-imagefolder" in done.stdout and "x naive" in done.stdout
    assert "trainer cpu ms/img pool cpu ms/img" in done.stdout
    # the verdict table ends the output, and the JSON carries the same verdicts
    table_lines = done.stdout.split("\nverdicts\n", 1)[1].splitlines()
    assert table_lines[0].split()[:4] == ["suite", "knob", "data", "setting"]
    judged = {(v["knob"], v["setting"], v["reference"]) for v in doc["verdicts"]}
    assert ("backend", "dataloader", "threads") in judged and ("loader", "threads", "naive-imagefolder") in judged
    assert ("format", "lmdb", "folder") in judged
    for v in doc["verdicts"]:
        said = f"{v['word']} ({v['why']})" if v["why"] else v["word"]
        assert v["word"] in ("helps", "no effect", "hurts", "unsure") and v["repeats"] == 2
        assert any(f"{v['setting']} vs {v['reference']}" in line and said in line and line.endswith(v["advice"])
                   for line in table_lines)
    assert "backend (requested)" not in done.stderr  # no INFO line per loader: one bar (on a terminal) only


def test_a_folder_with_bad_files_is_benched_and_the_row_that_cannot_read_it_says_why(long_folder, tmp_path):
    """fixtures/imagefolder's empty, truncated, text and bomb files among the long folder's images: the
    naive baseline serves the next file in their place, DALI's plain pipeline (which stops at the first
    file it cannot map) becomes one row saying so, and the run goes on (it used to end with DALI's
    traceback)."""
    shutil.copytree(long_folder, tmp_path / "folder")
    for bad in BAD_FILES:
        shutil.copyfile(IMAGEFOLDER / bad, tmp_path / "folder" / bad)
    done = run("bench", tmp_path / "folder", "--suites", "baseline,pipeline", "--backends", "threads,dali",
               *LONG, "--repeats", "2")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    rows = {line.split()[3]: line for line in done.stdout.splitlines() if line.startswith("folder ")}
    assert "failed: DALI's plain pipeline cannot read this folder: File mapping failed" in rows["plain-dali-cpu"]
    assert rows["plain-dali-cpu"].split()[4] == "-"  # a failed row prints no figure (it said "skipped")
    assert float(rows["naive-imagefolder"].split()[4]) > 0 and float(rows["threads"].split()[4]) > 0


def test_no_row_with_a_figure_exits_non_zero_with_the_reason_in_one_line(packed_lmdb):
    """#48 row 2: every row failed or too short (here: the 26-record fixture at batch 64, which the
    warm-up uses up), and bench exited 0. It prints its table, then one line, and exits 2."""
    done = run("bench", packed_lmdb, "--suites", "pipeline", "--backends", "threads,dataloader", "--workers", "1")
    assert done.returncode == 2, done.stdout + done.stderr[-2000:]
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert done.stderr.startswith("datapipe bench: error: no row produced a figure; 2 of 2 rows say, like "
                                  "fixture.lmdb pipeline threads: too short: 0 batches per worker timed")
    assert "fixture.lmdb is too short to time 2 rows: they need >= 3,456 records" in done.stdout
