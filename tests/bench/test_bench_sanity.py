"""#48 row 1: a row whose workers had the data decoded before the timer started is not a throughput.
The too-short rule proven both ways on injected clocks and batch counts (no test times a real run),
the decode-rate bound both ways on injected rows, the one-line reasons, and a real run on a dataset
shorter than the warm-up."""
import pytest
import torch

from datapipe.bench import BenchOptions, run_bench
from datapipe.bench.report import document, table
from datapipe.bench.sanity import beyond_decode, no_figure, records_needed, short_data_lines, too_short
from datapipe.bench.suites import Case, Row
from datapipe.bench.verdicts import verdict_table, verdicts
from datapipe.bench.window import Timing, timed
from tests.processes import deadline


def epoch_of(batches: int, seconds_each: float = 0.01, images: int = 8):
    """make_batches for timed: an epoch of `batches` batches, each `seconds_each` on a fake clock."""
    now = [0.0]

    def make(_):
        for _ in range(batches):
            now[0] += seconds_each
            yield [0] * images

    return make, lambda: now[0]


def measured(batches: int, workers: int, opts: BenchOptions, backend: str = "threads", **epoch) -> Row:
    make, clock = epoch_of(batches, **epoch)
    run = timed(make, len, opts, torch.device("cpu"), step=False, clock=clock)
    case = Case("d.lmdb", "lmdb", "pipeline", backend, run, knobs={"backend": backend}, workers=workers)
    return case.row([run(r) for r in range(opts.repeats)], opts)


OPTS = BenchOptions(batch_size=8, seconds=60, repeats=3, warmup=2)


def test_a_loader_row_needs_50_batches_per_worker_after_the_warm_up():
    """2 workers: 100 batches in the window. An epoch of 104 batches (2 warm-up, 2 drained) is enough,
    103 is not: that row prints no figure, says what it needs, and gives no verdict."""
    assert records_needed(2, OPTS) == (50 * 2 + 2 + 2) * 8 == 832
    enough = measured(104, 2, OPTS)
    assert enough.images_per_s == pytest.approx(800) and not enough.note and enough.batches_per_worker == 50
    short = measured(103, 2, OPTS, backend="prefetch")
    assert short.images_per_s == 0.0 and short.runs == [] and short.needs_records == 832
    assert short.note == ("too short: 49.5 batches per worker timed, needs >= 50: >= 832 records at batch 8 and "
                          "2 workers, or a smaller --batch-size")
    assert short.trainer_cpu_ms_per_image is None and short.batches_per_worker == 49.5
    reference = Row("d.lmdb", "lmdb", "pipeline", "threads", 800.0, runs=[800.0] * 3, knobs={"backend": "threads"},
                    defaults=["backend"])
    assert verdicts([reference, short]) == [] and len(verdicts([reference, enough])) == 1
    line = next(ln for ln in table([reference, short]).splitlines() if " prefetch " in ln)
    assert line.split()[4] == "-" and line.endswith(short.note)  # no figure in the img/s column
    assert document([short], {}, {})["results"][0]["images_per_s"] is None
    assert short_data_lines([reference, short]) == [
        "d.lmdb is too short to time 1 row: they need >= 832 records at this --batch-size, or a smaller "
        "--batch-size (their notes say why)"]


def test_a_window_cut_by_the_clock_asks_for_more_seconds():
    """0.5 s at 10 ms a batch: 50 batches, enough for 1 worker, 25 per worker for 2."""
    opts = BenchOptions(batch_size=8, seconds=0.5, repeats=2, warmup=2)
    assert not measured(1000, 1, opts).note
    short = measured(1000, 2, opts)
    assert short.note == "too short: 25 batches per worker timed in 0.5 s, needs >= 50: --seconds 1 or more"
    assert short.needs_records is None and short.images_per_s == 0.0
    # the same window on a dataset shorter than a window needs: more seconds would not help
    note, needs = too_short([Timing(400.0, 0.0, 1.0, None, 50, False)], 2, opts, records=500)
    assert needs == (50 * 2 + 2 + 2) * 8 and note.startswith("too short: 25 batches per worker timed, needs >= 50: >= 832")


def test_suites_without_look_ahead_need_one_batch():
    opts = BenchOptions(batch_size=8, seconds=60, repeats=1, warmup=2)
    make, clock = epoch_of(4)
    run = timed(make, len, opts, torch.device("cpu"), step=False, clock=clock)
    row = Case("d", "lmdb", "decode", "pil-1-core", run).row([run(0)], opts)
    assert row.images_per_s > 0 and not row.note and row.batches_per_worker is None


def rows_124(prefetch: float) -> list[Row]:
    """#48's 124-image sample: the decode suite's one-core rates and the pipeline rows."""
    decode = [Row("s.lmdb", "lmdb", "decode", "train-view-whole", 387.0, runs=[387.0]),
              Row("s.lmdb", "lmdb", "decode", "train-view-region", 529.0, runs=[529.0])]
    loaders = [Row("s.lmdb", "lmdb", "pipeline", b, rate, runs=[rate], knobs={"backend": b})
               for b, rate in (("threads", 596.0), ("prefetch", prefetch), ("dali", 17882.0))]
    return decode + loaders


def test_a_row_faster_than_every_core_decoding_is_no_throughput():
    rows = rows_124(17882.0)
    beyond_decode(rows, cores=2, cuda=False)
    prefetch, dali = rows[3], rows[4]
    assert prefetch.images_per_s == 0.0 and prefetch.runs == [] and prefetch.note.startswith(
        "not a throughput: above 2 cores x the 529 img/s one core decodes")
    assert dali.note.startswith("not a throughput")  # DALI's CPU operators decode on these cores too
    assert rows[2].images_per_s == 596.0 and not rows[2].note  # the threads row stands
    assert {v.setting for v in verdicts(rows)} <= {"region"}  # nothing is judged from the marked rows
    on_gpu = rows_124(1500.0)  # within 1.5 x 2 x 529 = 1,587: a throughput; DALI decodes on the GPU
    beyond_decode(on_gpu, cores=2, cuda=True)
    assert not any(r.note for r in on_gpu)


def test_no_figure_says_why_in_one_line():
    failed = [Row("d.lmdb", "lmdb", "pipeline", f"ray p={n}", 0.0, note="failed: boom") for n in (1, 2)]
    reason = no_figure(failed)
    assert reason == "no row produced a figure; 2 of 2 rows say, like d.lmdb pipeline ray p=1: failed: boom"
    assert no_figure(failed + [Row("d.lmdb", "lmdb", "read", "-", 10.0, runs=[10.0])]) is None
    assert no_figure([]).startswith("no row to run")


def test_a_dataset_shorter_than_the_warm_up_is_too_short_not_failed(packed_lmdb):
    """The fixture's 26 records make one batch of 64: the warm-up takes it. The row used to say
    "failed: no batch left after 2 warm-up batches"; it is too short, and says how many records it needs."""
    options = BenchOptions(backends=("threads",), batch_size=64, image_size=32, repeats=2, workers=1)
    with deadline(300):
        (row,) = run_bench([packed_lmdb], options, suites=("pipeline",))
    assert row.note == ("too short: 0 batches per worker timed, needs >= 50: >= 3,456 records at batch 64 and "
                        "1 worker, or a smaller --batch-size")
    assert row.needs_records == 3456 and row.images_per_s == 0.0


def test_a_loader_that_skipped_most_records_is_not_called_a_short_dataset():
    opts = BenchOptions(batch_size=8, seconds=60, repeats=1, warmup=2)
    note, needs = too_short([Timing(100.0, 0.0, 1.0, None, 3, True)], 1, opts, records=10_000)
    assert needs is None and note == ("too short: 3 batches per worker timed, needs >= 50; its 10,000 records would "
                                      "give enough: the loader skipped most as unreadable")
    assert too_short([Timing(100.0, 0.0, 1.0, None, 3, True)], 1, opts, records=100)[1] == 432


def test_bench_refuses_nan_seconds():
    """--seconds nan timed nothing and then said the data was too short."""
    with pytest.raises(ValueError, match="seconds > 0"):
        BenchOptions(seconds=float("nan"))
    with pytest.raises(ValueError, match="simulate_step_ms must be >= 0"):
        BenchOptions(simulate_step_ms=float("nan"))


def test_bench_refuses_an_image_size_the_loaders_refuse():
    """The decode suite resized to --image-size without the loaders' check: 0 gave figures, 100000 a
    30 GB tensor per image."""
    for size in (0, 100_000):
        with pytest.raises(ValueError, match="image_size must be within 8..8192"):
            BenchOptions(image_size=size)


def test_names_with_terminal_escapes_print_as_text():
    data = "/x/\x1b[2J\x1b[31mred\x07.lmdb"
    rows = [Row(data, "lmdb", "pipeline", "threads", 0.0, note="too short: x", needs_records=832),
            Row(data, "lmdb", "read", "-", 10.0, runs=[10.0, 10.0], knobs={"format": "lmdb"}),
            Row("/x/f", "folder", "read", "-", 5.0, runs=[5.0, 5.0], knobs={"format": "folder"})]
    shown = "\n".join([table(rows), *short_data_lines(rows), no_figure(rows[:1]), verdict_table(verdicts(rows))])
    assert "\x1b" not in shown and "\x07" not in shown and "\\x1b[2J\\x1b[31mred\\x07.lmdb" in shown


def test_data_that_never_decodes_is_said_so(tmp_path):
    for k in range(40):  # a PNG signature over zeros: scanned as images, decoded by none
        folder = tmp_path / "bad" / "train" / f"c{k % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{k}.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(64))
    options = BenchOptions(backends=("threads",), batch_size=8, image_size=32, repeats=1, workers=1, seconds=60)
    with deadline(300):
        rows = run_bench([tmp_path / "bad"], options, suites=("decode",))
    assert {r.note for r in rows} == {"skipped: none of the first 40 records decodes"}
