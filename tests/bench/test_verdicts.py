"""Bench verdicts: the rule on injected numbers (no clock), the table, the JSON, the plot's legend,
doctor and bench giving the same advice, and the suites that mark which row is the default."""
import dataclasses
import json
import subprocess
import sys

import pytest
import torch

from datapipe.bench import BenchOptions, run_bench
from datapipe.bench.advice import machine_advice
from datapipe.bench.report import document, figure, plot, write_json
from datapipe.bench.settle import settle
from datapipe.bench.suites import Row
from datapipe.bench.verdicts import MIN_EFFECT, judge, verdict_table, verdicts
from datapipe.doctor.pipeline import diagnose
from tests.processes import deadline


def row(backend, runs, *, suite="pipeline", data="d.lmdb", fmt="lmdb", knobs=None, defaults=()):
    return Row(data, fmt, suite, backend, sorted(runs)[len(runs) // 2], runs=list(runs),
               knobs=knobs if knobs is not None else {"backend": backend}, defaults=list(defaults))


def test_judge_reads_paired_repeats():
    assert judge([142, 135, 149], [100, 100, 100]) == pytest.approx((1.42, 1.35, 1.49, "helps"))
    assert judge([70, 72, 69], [100, 100, 100])[3] == "hurts"
    assert judge([110, 95, 120], [100, 100, 100])[3] == "unsure"  # the range crosses 1.0, 5-20% off it
    assert judge([74, 127, 81], [100, 100, 100])[3] == "unsure"  # 0.81x, yet one repeat 1.27x: not "no effect"
    small = 1 + MIN_EFFECT / 2
    assert judge([100 * small] * 3, [100, 100, 100])[3] == "no effect"  # consistent but under MIN_EFFECT
    assert judge([99, 102, 101], [100, 100, 100])[3] == "no effect"  # every repeat within MIN_EFFECT of 1.0
    assert judge([200], [100])[3] == "unsure"  # one repeat: no spread to judge
    # paired by repeat: a machine that slowed down for repeat 2 slowed both rows, the ratio holds
    assert judge([150, 75, 150], [100, 50, 100])[3] == "helps"
    with pytest.raises(ValueError, match="no paired runs"):
        judge([1.0], [0.0])


def test_backend_verdicts_recommend_a_measured_winner_or_else_the_default():
    rows = [row("threads", [100, 100, 100], defaults=["backend"]), row("dataloader", [130, 125, 140]),
            row("prefetch", [98, 102, 101]), row("dali", [60, 55, 58])]
    found = {v.setting: v for v in verdicts(rows)}
    assert {s: v.word for s, v in found.items()} == {"dataloader": "helps", "prefetch": "no effect", "dali": "hurts"}
    assert {v.reference for v in found.values()} == {"threads"} and found["dataloader"].recommend == "dataloader"
    assert found["dataloader"].row == 1 and found["dataloader"].reference_row == 0
    assert {v.advice for v in found.values()} == {"use dataloader"}
    rows[1] = row("dataloader", [102, 97, 100])  # now nothing beats the default: keep it
    assert {(v.recommend, v.advice) for v in verdicts(rows)} == {("threads", "keep the default, threads")}


def test_an_unsure_verdict_keeps_the_default_and_says_so_everywhere(tmp_path):
    """#48 row 3: `ray vs threads 3.17x ... unsure -> threads` and `2 vs 1 1.21x ... recommend 1` read
    as recommending the slower setting. An unsure line says why and that the default is kept, in the
    table, the JSON and the plot alike."""
    one = [row("threads", [100], defaults=["backend"]), row("ray", [317], knobs={"backend": "ray"})]
    (v,) = verdicts(one)
    assert (v.word, v.why, v.said) == ("unsure", "one repeat", "unsure (one repeat)")
    assert (v.recommend, v.advice) == ("threads", "keep the default, threads")
    pools = [row("ray p=2", [121, 90, 140], knobs={"pool_workers": "2"}),
             row("ray p=1", [100, 100, 100], knobs={"pool_workers": "1"}, defaults=["pool_workers"])]
    (p,) = verdicts(pools)
    assert (p.setting, p.reference, p.said, p.advice) == ("2", "1", "unsure (spread too wide)",
                                                          "keep the default, 1")
    lines = verdict_table([v, p]).splitlines()
    assert "unsure (one repeat)" in lines[3] and lines[3].endswith("keep the default, threads")
    assert "unsure (spread too wide)" in lines[4] and lines[4].endswith("keep the default, 1")
    assert "keep the default" in lines[-1]  # the rule underneath says it too
    doc = document(one, {}, {}, [v])
    assert doc["verdicts"][0]["why"] == "one repeat" and doc["verdicts"][0]["advice"] == "keep the default, threads"
    texts = [t.get_text() for t in figure(one, "t", [v]).axes[0].texts]
    assert "unsure (one repeat) 3.17x vs threads" in texts


def test_the_advice_names_a_default_that_hurts_and_a_reference_that_is_no_default():
    decode = [row("train-view-whole", [100, 100, 100], suite="decode", knobs={"decode": "whole"}),
              row("train-view-region", [80, 82, 79], suite="decode", knobs={"decode": "region"}, defaults=["decode"])]
    assert verdicts(decode)[0].advice == "use whole (the default, region, hurts)"
    reads = [row("-", [100, 100, 100], suite="read", data="images", fmt="folder", knobs={"format": "folder"}),
             row("-", [101, 99, 100], suite="read", data="a.lmdb", knobs={"format": "lmdb"})]
    assert verdicts(reads)[0].advice == "keep folder (the reference)"


def test_reference_and_default_differ_for_decode_and_pinned_memory():
    decode = [row("train-view-whole", [100, 100, 100], suite="decode", knobs={"decode": "whole"}),
              row("train-view-region", [101, 99, 102], suite="decode", knobs={"decode": "region"}, defaults=["decode"])]
    (v,) = verdicts(decode)
    assert (v.setting, v.reference, v.word, v.recommend) == ("region", "whole", "no effect", "region")
    decode[1].runs = [80, 82, 79]
    assert verdicts(decode)[0].recommend == "whole"  # the default measured slower: the reference wins
    h2d = [row("pinned", [300, 310, 305], suite="h2d", knobs={"pinned_memory": "pinned"}, defaults=["pinned_memory"]),
           row("pageable", [100, 100, 100], suite="h2d", knobs={"pinned_memory": "pageable"})]
    (v,) = verdicts(h2d)
    assert (v.setting, v.reference, v.word, v.recommend) == ("pinned", "pageable", "helps", "pinned")


def test_format_compares_datasets_against_a_folder_and_skipped_rows_are_left_out():
    rows = [row("-", [1000, 1000, 1000], suite="read", data="a.lmdb", knobs={"format": "lmdb"}),
            row("-", [400, 420, 410], suite="read", data="images", fmt="folder", knobs={"format": "folder"}),
            row("-", [800, 790, 810], suite="read", data="a.wds", fmt="wds", knobs={"format": "wds"}),
            Row("a.h5", "hdf5", "read", "-", 0.0, note="skipped: no h5py", knobs={"format": "hdf5"})]
    found = verdicts(rows)
    assert [(v.data, v.setting, v.reference, v.word) for v in found] == [
        ("a.lmdb", "lmdb", "folder", "helps"), ("a.wds", "wds", "folder", "helps")]
    assert {v.recommend for v in found} == {"lmdb"}  # the fastest of those that help


def test_loader_knobs_are_compared_one_at_a_time():
    def case(w, pf, runs):
        defaults = [k for k, ok in (("workers", w == 2), ("prefetch_factor", pf == 2)) if ok]
        return row(f"threads w={w} pf={pf}", runs, suite="loader", knobs={"workers": str(w), "prefetch_factor": str(pf)},
                   defaults=defaults)

    rows = [case(2, 2, [100, 100, 100]), case(1, 2, [60, 62, 58]), case(4, 2, [99, 102, 100]),
            case(2, 4, [100, 101, 99])]
    found = [(v.knob, v.setting, v.reference, v.word, v.recommend) for v in verdicts(rows)]
    assert found == [("workers", "1", "2", "hurts", "2"), ("workers", "4", "2", "no effect", "2"),
                     ("prefetch_factor", "4", "2", "no effect", "2")]


def test_table_and_json_carry_the_verdicts(tmp_path):
    rows = [row("naive-imagefolder", [100, 100, 100], suite="baseline", knobs={"loader": "naive-imagefolder"}),
            row("threads", [142, 135, 149], knobs={"backend": "threads", "loader": "threads"},
                defaults=["backend", "loader"])]
    found = verdicts(rows)
    text = verdict_table(found)
    assert "threads vs naive-imagefolder" in text and "1.42x (1.35-1.49)" in text and "helps" in text
    assert "no effect = every ratio within 3% of 1.0" in text.splitlines()[-1]
    assert "no two rows measured the same knob" in verdict_table([])
    out = tmp_path / "bench.json"
    write_json(out, document(rows, {"cores": 2}, {}, found))
    doc = json.loads(out.read_text())
    (v,) = doc["verdicts"]
    assert v["word"] == "helps" and v["ratio"] == 1.42 and (v["low"], v["high"]) == (1.35, 1.49)
    assert doc["results"][v["row"]]["backend"] == "threads" and v["recommend"] == "threads" and doc["verdict_rule"]


def test_plot_has_a_legend_and_the_verdict_words(tmp_path):
    rows = [row("train-view-whole", [100, 100, 100], suite="decode", knobs={"decode": "whole"}),
            row("train-view-region", [120, 118, 125], suite="decode", knobs={"decode": "region"}, defaults=["decode"]),
            row("naive-imagefolder", [100, 100, 100], suite="baseline", knobs={"loader": "naive-imagefolder"}),
            row("threads", [90, 95, 92], knobs={"backend": "threads", "loader": "threads"}, defaults=["backend"])]
    found = verdicts(rows)
    fig = figure(rows, "t", found)
    (ax,) = fig.axes
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert {"decode", "baseline", "pipeline", "verdict: helps", "verdict: hurts"} <= set(labels)
    texts = [t.get_text() for t in ax.texts]
    assert "helps 1.20x vs whole" in texts and "hurts 0.92x vs naive-imagefolder" in texts
    short = Row("d.lmdb", "lmdb", "pipeline", "dali", 0.0, note="too short: x")
    (ax,) = figure(rows + [short], "t", found[:1]).axes  # the one verdict on a shown bar: region helps
    assert [t.get_text() for t in ax.get_legend().get_texts()][-1:] == ["verdict: helps"]
    assert "1 row without a figure (too short, failed or skipped) left out" in ax.get_xlabel()
    plot(tmp_path / "b.png", rows, "t", found)
    assert (tmp_path / "b.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_doctor_advises_what_bench_recommends_when_nothing_measures_better(packed_lmdb, long_lmdb):
    """Doctor prints datapipe's default for every knob bench measures and how to measure it (on data
    long enough to: doctor/bench.py); a real bench run marks those same settings as the default rows,
    and where every setting measured the same (injected runs) bench's verdicts recommend exactly
    doctor's settings."""
    device = torch.device("cpu")
    checks = {c.name: c for c in diagnose(long_lmdb, {})}
    advice = {a.knob: a for a in machine_advice(device)}
    for knob, a in advice.items():
        check = checks[f"default_{knob}"]
        assert check.value.startswith(f"{a.setting} (")
        assert f"datapipe bench {long_lmdb} --suites {a.suites}" in check.hint
    options = BenchOptions(backends=("threads", "dataloader"), batch_size=4, image_size=32, seconds=60, repeats=2,
                           warmup=0, min_batches=1)  # which rows are defaults, not figures: the short fixture does
    with deadline(300):
        rows = run_bench([packed_lmdb], options, suites=("decode", "pipeline", "loader"))
    measured = {k for r in rows for k in r.knobs}
    assert {"backend", "workers", "prefetch_factor", "decode"} <= measured
    for r in rows:
        for knob in r.defaults:
            if knob in advice:
                assert r.knobs[knob] == advice[knob].setting, (r, advice[knob])
    flat = [dataclasses.replace(r, runs=[100.0, 100.0]) for r in rows]
    found = verdicts(flat)
    judged = {v.knob for v in found} & advice.keys()
    assert {v.word for v in found} == {"no effect"} and {"backend", "workers", "prefetch_factor"} <= judged
    assert {(v.knob, v.recommend) for v in found if v.knob in advice} == {(k, advice[k].setting) for k in judged}


def test_loader_suite_times_workers_and_prefetch_factor(packed_lmdb):
    options = BenchOptions(batch_size=4, image_size=32, seconds=60, repeats=2, warmup=0, workers=2,
                           min_batches=1)  # the suite's rows and knobs, not their figures: the short fixture does
    with deadline(300):
        rows = run_bench([packed_lmdb], options, suites=("loader",))
    assert [(r.knobs["workers"], r.knobs["prefetch_factor"]) for r in rows] == [("2", "2"), ("1", "2"), ("4", "2"),
                                                                                ("2", "4")]
    assert all(r.images_per_s > 0 and len(r.runs) == 2 for r in rows)
    assert [v.knob for v in verdicts(rows)] == ["workers", "workers", "prefetch_factor"]


def test_settle_waits_for_work_left_in_flight():
    readings = iter([0.0, 1.0, 2.0, 2.0])  # busy, busy, then idle for a window
    calls = []

    def cpu():
        calls.append(1)
        return next(readings)

    settle(cpu=cpu, window_s=0.001)
    assert len(calls) == 4
    settle(cpu=lambda: None)  # no /proc: nothing to wait for
    child = subprocess.Popen([sys.executable, "-c", "for _ in range(2 * 10**7): pass"])
    try:
        settle(limit_s=120, window_s=0.5, busy_cores=0.05)  # a loaded machine still gives it 0.05 cores
        assert child.poll() is not None  # a busy child of this process ran to its end first
    finally:
        child.kill()
        child.wait()
