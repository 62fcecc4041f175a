"""A too-short row counts its batches in words a person reads: the docs' 27-record sample printed
"too short: 1 batches per worker timed" for each of its loader rows."""
from datapipe.bench import BenchOptions
from datapipe.bench.sanity import too_short
from datapipe.bench.window import Timing

OPTS = BenchOptions(batch_size=8, seconds=0.5, repeats=2, warmup=2)


def note(batches: int, workers: int, records: int | None = 27) -> str:
    return too_short([Timing(100.0, 0.0, 1.0, None, batches, True)], workers, OPTS, records=records)[0]


def test_one_batch_is_a_batch():
    assert note(2, 2).startswith("too short: 1 batch per worker timed, needs >= 50: >= 832 records at batch 8")
    assert note(1, 1).startswith("too short: 1 batch per worker timed")
    assert note(0, 0, records=None).startswith("too short: 0 batches timed, needs >= 1")


def test_other_counts_stay_plural():
    assert note(4, 2).startswith("too short: 2 batches per worker timed")
    assert note(3, 2).startswith("too short: 1.5 batches per worker timed")
    assert note(0, 2).startswith("too short: 0 batches per worker timed")
