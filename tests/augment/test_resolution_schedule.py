"""#47 rows 5-6, item 4: a size schedule's cost is linear in its length (counted, never timed), a ramp's
in its sizes, a step schedule's per call in log of its points; a hostile schedule given in Python (a
function that raises or gives junk, an epoch past any run, a million-entry list) is one ValueError line,
in bounded time and memory."""
from __future__ import annotations

import builtins
import math
import random

import pytest

from datapipe import make_loader
from datapipe.augment import resolution
from datapipe.augment.resolution import (MAX_SCHEDULE_EPOCHS, SizeRamp, SizeSteps, run_sizes, size_schedule,
                                         sizes_text)
from datapipe.train.config import TrainConfig

N = 10**6


class Work:
    """The elements this module's container builtins and helpers look at (max, sorted, last_size, ...):
    each call adds its argument's length; over `budget` it fails at once (a quadratic loop stops early)."""

    NAMES = ("max", "min", "sorted", "sum", "any", "all", "last_size")  # not the types: isinstance takes those

    def __init__(self, monkeypatch, budget: int) -> None:
        self.seen, self.budget = 0, budget
        for name in self.NAMES:
            original = getattr(resolution, name, None) or getattr(builtins, name)
            monkeypatch.setattr(resolution, name, self.counted(original), raising=False)

    def counted(self, original):
        def call(*args, **kwargs):
            if args and not isinstance(args[0], (int, str)):
                items = args[0] if hasattr(args[0], "__len__") else list(args[0])
                self.seen += len(items)
                if self.seen > self.budget:
                    raise AssertionError(f"{self.seen:,} elements looked at, over the budget of {self.budget:,}")
                args = (items, *args[1:])
            return original(*args, **kwargs)
        return call


def test_a_million_alternating_sizes_cost_linear_work(monkeypatch):
    """Row 6: each point took a max() over every change before it (200,000 alternating sizes: > 60 s;
    10**6: ~2 h). Now the elements looked at are a few per point."""
    sizes = [8, 16] * (N // 2)
    work = Work(monkeypatch, budget=4 * N)
    assert run_sizes(sizes, 3) == dict(enumerate(sizes))
    assert run_sizes({str(e): s for e, s in enumerate(sizes)}, 3) == dict(enumerate(sizes))
    assert work.seen <= 4 * N


def test_the_change_points_keep_the_first_epoch_of_each_size():
    assert run_sizes([160, 160, 192, 192, 160], 9) == {0: 160, 2: 192, 4: 160}
    assert run_sizes({"4": 192, "0": 160, "2": 160}, 9) == {0: 160, 4: 192}
    assert run_sizes([224] * 1000, 9) == 224


def test_a_schedules_log_text_is_short_whatever_its_length():
    """What a log line shows of run_sizes' value (the whole {0: 32, 1: 40, ...} of 200,000 changes was 2.3 MB)."""
    assert sizes_text(224) == "224" and sizes_text({0: 160, 10: 192}) == "{0: 160, 10: 192}"
    text = sizes_text(run_sizes([32, 40] * 100_000, 1))
    assert text == ("{0: 32, 1: 40, 2: 32, 3: 40, 4: 32, 5: 40, 6: 32, 7: 40, ...} (200,000 changes; 40 from "
                    "epoch 199,999)")


def test_a_ramp_is_read_a_few_times_a_size_whatever_the_run():
    """A SizeRamp's changes by bisection: FFCV's ramp over 10**9 epochs read ~60 times, not once an
    epoch (a function of the epoch is read each epoch: 10**9 calls)."""
    calls = []

    class Counted(SizeRamp):
        def __call__(self, epoch):
            calls.append(epoch)
            if len(calls) > 40 * (self.max_size - self.min_size + 2):  # over ~30 reads a size: stop at once
                raise AssertionError(f"the ramp was read {len(calls):,} times")
            return super().__call__(epoch)

    assert run_sizes(Counted(160, 192, 3 * 10**8, 7 * 10**8, 32), 10**9) == {0: 160, 500_000_000: 192}
    assert len(calls) <= 64
    calls.clear()
    assert len(run_sizes(Counted(8, 8192, 0, 10**9, 1), 10**9)) == 8185  # every size from 8 to 8192


def test_a_ramps_changes_match_reading_every_epoch():
    rng = random.Random(47)
    for _ in range(500):
        low = rng.randint(8, 500)
        ramp = SizeRamp(low, rng.randint(low, 600), start := rng.randint(0, 40), rng.randint(start, 90),
                        rng.choice([1, 3, 32, 1000]))
        epochs = rng.randint(1, 120)
        every = [ramp(epoch) for epoch in range(epochs)]
        want = {e: s for e, s in enumerate(every) if e == 0 or every[e - 1] != s}
        assert run_sizes(ramp, epochs) == (want[0] if len(want) == 1 else want), (ramp, epochs)


def test_a_step_schedule_searches_the_epochs_it_built_once(monkeypatch):
    """SizeSteps built the list of its epochs on every call: O(points) an epoch asked."""
    steps = SizeSteps(tuple((epoch, 8 + epoch % 2) for epoch in range(N)))
    searched = []
    real = resolution.bisect.bisect_right
    monkeypatch.setattr(resolution.bisect, "bisect_right", lambda a, x: searched.append(a) or real(a, x))
    assert [steps(e) for e in (0, 1, 77, N - 1, 10 * N)] == [8, 9, 9, 9, 9]
    assert len(searched) == 5 and all(a is searched[0] for a in searched) and len(searched[0]) == N


@pytest.mark.parametrize("points", [(), ((1, 160),), ((0, 160), (0, 192)), ((0, 160), (5, 1), (3, 2)),
                                    ((True, 160),), ((0.0, 160),), ((0,),), [(0, 160)]])
def test_a_step_schedule_of_bad_points_is_one_line(points):
    with pytest.raises(ValueError, match=r"^SizeSteps needs points \(\(epoch, size\), ...\) at increasing epochs "
                                         r"from epoch 0, got "):
        SizeSteps(points)


def deep(levels: int) -> list:
    value: list = [160]
    for _ in range(levels):
        value = [value]
    return value


@pytest.mark.parametrize("value,message", [
    (lambda epoch: 1 // 0, r"the image size schedule raised ZeroDivisionError\('integer division or modulo by "
                           r"zero'\) for epoch 0: it must return an int within 8..8192 for every epoch; fix the"),
    (lambda epoch: 160.0, r"the image size schedule gave 160.0 \(float\) for epoch 0: it must return an int >= 8"),
    (lambda epoch: True, r"the image size schedule gave True \(bool\) for epoch 0"),
    (lambda epoch: math.nan, r"the image size schedule gave nan \(float\) for epoch 0"),
    (lambda epoch: -160, r"the image size schedule gave -160 \(int\) for epoch 0"),
    (lambda epoch: 10**5000, r"the image size schedule gave an int of about 5,000 digits \(int\) for epoch 0"),
    (lambda epoch: 160 if epoch < 3 else deep(5000), r"gave a list of 1 item \(list\) for epoch 3"),
    ({0: 160, 10**9: 192}, r"the schedule's epoch 1000000000 is past the 1,048,576 epochs a size schedule may name"),
    ({0: 160, 10**5000: 192}, r"the schedule's epoch an int of about 5,000 digits is past the 1,048,576 epochs"),
    ({"0": 160, "9" * 10**6: 192}, r"the schedule's epoch '9999.*\.\.\. is not an epoch number \(0, 1, ...\)"),
    ({"0": 160, "\u00b2": 192}, r"the schedule's epoch '\u00b2' is not an epoch number"),
    ({"0": 160, "\u0663": 192}, r"the schedule's epoch '\u0663' is not an epoch number"),
    ({"0": 160, "00": 192}, r"the schedule gives epoch 0 twice \(as '00' too\); keep one"),
    ({"0": 160, -1: 192}, r"the schedule's epoch -1 is not an epoch number"),
    ([160] * (MAX_SCHEDULE_EPOCHS + 1), r"image_size: a list of 1,048,577 epochs is over the 1,048,576 a size "
                                        r"schedule may name; give the sizes where they change"),
    (dict.fromkeys(range(MAX_SCHEDULE_EPOCHS + 1), 160), r"a schedule of 1,048,577 epochs is over the 1,048,576"),
    ([10**5000], r"image_size of epoch 0 must be within 8..8192 \(an int.*got an int of about 5,000 digits$"),
    ([deep(5000)], r"image_size of epoch 0 must be within 8..8192 \(an int.*got a list of 1 item$"),
    ([160, {"a": list(range(10**6))}], r"image_size of epoch 1 must be within .*got a dict of 1 item$"),
    ("\u00b2", r"image_size '\u00b2' is neither a size nor MIN:MAX"),
    ("160:" + "9" * 5000, r"image_size '160:9999.* is neither a size nor MIN:MAX"),
])
def test_a_hostile_schedule_in_python_is_one_line(value, message):
    with pytest.raises(ValueError, match=message) as refused:
        TrainConfig(data="d", out="o", image_size=value, epochs=5)
    assert len(str(refused.value).splitlines()) == 1 and len(str(refused.value)) < 400


def test_a_function_is_read_over_at_most_max_schedule_epochs():
    with pytest.raises(ValueError, match=r"^image_size: a function of the epoch read over 1,000,000,000 epochs is "
                                         r"over the 1,048,576 a size schedule may name"):
        TrainConfig(data="d", out="o", image_size=lambda epoch: 160, epochs=10**9)
    assert TrainConfig(data="d", out="o", image_size="160:192", epochs=10**9).image_size == {0: 160, 812_499_999: 192}


def test_a_loaders_schedule_that_raises_later_is_one_line_naming_the_epoch(clean_folder):
    """make_loader(image_size=f): f(0) when it is built, f(epoch) at each epoch; what f raises is one line."""
    loader = make_loader(clean_folder, image_size=lambda epoch: 16 if epoch < 2 else [][epoch], batch_size=4,
                         num_workers=0, backend="dataloader")
    assert loader.image_size_at(1) == 16
    with pytest.raises(ValueError, match=r"^the image size schedule raised IndexError\('list index out of range'\) "
                                         r"for epoch 2: .*; fix the function$") as refused:
        loader.image_size_at(2)
    assert isinstance(refused.value.__cause__, IndexError)
    assert size_schedule(size_schedule(lambda epoch: 32))(7) == 32  # wrapped once: a ValueError is not re-wrapped


@pytest.mark.parametrize("schedule", [{0: 16, 1: 24}, {"0": 16, "1": 24}, [16, 24]])
def test_make_loader_takes_a_step_schedule_as_data(packed_lmdb, schedule):
    """As --image-size-schedule's file does: it was refused, "image_size must be an int"."""
    from datapipe import make_loader

    loader = make_loader(packed_lmdb, batch_size=4, image_size=schedule, backend="threads", num_workers=0)
    sides = []
    for _ in range(3):
        sides.append(next(iter(loader)).images.shape[-1])
        loader.set_epoch(loader.epoch + 1)
    assert sides == [16, 24, 24]
