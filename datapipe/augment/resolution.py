"""Progressive resizing: the train image size as a function of the epoch (FFCV's ramp, a step schedule,
or yours), and a run's sizes as plain data (`datapipe train`: run_sizes)."""
from __future__ import annotations

import bisect
import itertools
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from ..checks import integer, shown

MIN_IMAGE_SIZE = 8
# The largest side a loader serves: a float32 batch of 64 at 8192 x 8192 is already 51 GB (at 16384,
# 206 GB); past it a typo (image_size=10**5: a 1.75 TiB batch) would reach the allocator.
MAX_IMAGE_SIZE = 8192
SIZE_RULE = f"pixels a side, at most MAX_IMAGE_SIZE={MAX_IMAGE_SIZE}"
# The most epochs a size schedule may name (a list's length, a mapping's entries, an epoch key) and a
# function of the epoch is read over: 2**20 (a run of 10**9 epochs is a typo). Each epoch read is a dict
# entry of run_sizes', so this bounds its memory (~100 MB) as well as its time.
MAX_SCHEDULE_EPOCHS = 1 << 20


def is_size(value: object) -> bool:
    """An int (not a bool) within MIN_IMAGE_SIZE..MAX_IMAGE_SIZE."""
    if type(value) is int:  # the common case, without the ABC's isinstance (a million-entry schedule)
        return MIN_IMAGE_SIZE <= value <= MAX_IMAGE_SIZE
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and \
        MIN_IMAGE_SIZE <= value <= MAX_IMAGE_SIZE


def check_image_size(value: object, name: str = "image_size") -> int:
    """An image size: an int (not a bool) within MIN_IMAGE_SIZE..MAX_IMAGE_SIZE; else one line naming it."""
    if is_size(value):
        return int(value)
    raise ValueError(f"{name} must be within {MIN_IMAGE_SIZE}..{MAX_IMAGE_SIZE} (an int, {SIZE_RULE}), "
                     f"got {shown(value)}")


@dataclass(frozen=True)
class SizeRamp:
    """FFCV's ResNet-50 schedule (`get_resolution`): min_size until start_epoch, max_size from
    end_epoch, linear between, rounded to a multiple of `step`. FFCV rn50: 160 -> 192 over epochs
    (end - start) of its run."""

    min_size: int
    max_size: int
    start_epoch: int
    end_epoch: int
    step: int = 32

    def __post_init__(self) -> None:
        low = check_image_size(self.min_size, "SizeRamp min_size")
        check_image_size(self.max_size, "SizeRamp max_size")
        integer("SizeRamp step", self.step, 1, MAX_IMAGE_SIZE)
        start = integer("SizeRamp start_epoch", self.start_epoch, 0)
        if low > self.max_size or start > integer("SizeRamp end_epoch", self.end_epoch, 0):
            raise ValueError(f"SizeRamp needs min_size <= max_size and start_epoch <= end_epoch; got sizes "
                             f"{low}..{self.max_size}, epochs {shown(self.start_epoch)}..{shown(self.end_epoch)}")

    def __call__(self, epoch: int) -> int:
        if epoch <= self.start_epoch:
            return self.min_size
        if epoch >= self.end_epoch:
            return self.max_size
        share = (epoch - self.start_epoch) / (self.end_epoch - self.start_epoch)
        size = self.min_size + share * (self.max_size - self.min_size)
        # within min..max even where step does not divide them (8 -> 16 by 32 rounded to 0)
        return max(self.min_size, min(self.max_size, int(round(size / self.step)) * self.step))

    def changes(self, epochs: int) -> dict[int, int]:
        """{first epoch: size} over a run of `epochs`, each size's first epoch found by bisection (the sizes
        never shrink): a few reads a size, not one an epoch (a 10**9-epoch ramp is as cheap as a short one)."""
        points, epoch, end = {0: self(0)}, 0, self(epochs - 1)
        while points[epoch] < end:
            epoch = bisect.bisect_right(range(epochs), points[epoch], lo=epoch, key=self)
            points[epoch] = self(epoch)
        return points


def size_schedule(value: "int | Mapping | list | Callable[[int], int]") -> Callable[[int], int]:
    """An epoch -> size function from a fixed size (checked now), a step schedule ({first epoch: size},
    or a list of sizes, one an epoch, the last one continuing: checked now, as --image-size-schedule's
    file is) or a function (each size it gives checked when it is called, naming the epoch: checked_size)."""
    if isinstance(value, (Mapping, list, tuple)):
        value = size_steps(run_sizes(value, 1))
    if isinstance(value, int):
        size = check_image_size(value)
        return lambda epoch: size
    if isinstance(value, _Checked):
        return value
    if callable(value):
        return _Checked(value)
    raise ValueError(f"image_size must be an int, a schedule ({{first epoch: size}} or a list of sizes) or a function "
                     f"of the epoch (e.g. SizeRamp), got {shown(value)}")


@dataclass(frozen=True)
class _Checked:
    """A function of the epoch whose each size is checked (size_at, checked_size), wrapped once."""

    schedule: Callable[[int], object]

    def __call__(self, epoch: int) -> int:
        return checked_size(size_at(self.schedule, epoch), epoch)


def size_at(schedule: Callable[[int], object], epoch: int) -> object:
    """What a function of the epoch gives for `epoch`; whatever it raises becomes one line naming the epoch
    (the original is the ValueError's __cause__)."""
    try:
        return schedule(epoch)
    except Exception as exc:  # noqa: BLE001 - the user's function: any error is its own
        raise ValueError(f"the image size schedule raised {shown(exc)} for epoch {epoch}: it must return an "
                         f"int within {MIN_IMAGE_SIZE}..{MAX_IMAGE_SIZE} for every epoch; fix the function") from exc


def checked_size(size: object, epoch: int) -> int:
    """A size an image size schedule gave for `epoch`: an int (not a bool) within MIN..MAX_IMAGE_SIZE."""
    if is_size(size):
        return int(size)
    raise ValueError(f"the image size schedule gave {shown(size)} ({type(size).__name__}) for epoch {epoch}: "
                     f"it must return an int >= {MIN_IMAGE_SIZE}, at most MAX_IMAGE_SIZE={MAX_IMAGE_SIZE}")


def ffcv_ramp(min_size: int, max_size: int, epochs: int) -> SizeRamp:
    """FFCV's rn50 ramp scaled to a run of `epochs`: min_size until epoch 3E/4 - 1, max_size from
    7E/8 - 1, by 32 px between. Each of ffcv-imagenet's six rn50 configs (16 to 88 epochs: start_ramp
    11, 17, 23, 29, 41, 65; end_ramp 13, 20, 27, 34, 48, 76) follows this rule exactly."""
    return SizeRamp(min_size, max_size, start_epoch=max(0, 3 * epochs // 4 - 1),
                    end_epoch=max(0, 7 * epochs // 8 - 1), step=32)


@dataclass(frozen=True)
class SizeSteps:
    """A step schedule: `points` ((first epoch, size), ...), the first at epoch 0; each size holds until
    the next point's epoch, the last one to the end of the run. Plain data (a checkpoint keeps it)."""

    points: tuple[tuple[int, int], ...]
    _epochs: tuple[int, ...] = field(init=False, repr=False, compare=False)  # searched by each call

    def __post_init__(self) -> None:
        pairs = isinstance(self.points, tuple) and all(
            isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], int) and not isinstance(p[0], bool)
            for p in self.points)
        epochs = tuple(epoch for epoch, _ in self.points) if pairs else ()
        if not epochs or epochs[0] != 0 or any(a >= b for a, b in zip(epochs, epochs[1:])):
            raise ValueError(f"SizeSteps needs points ((epoch, size), ...) at increasing epochs from epoch 0, "
                             f"got {shown(self.points)}")
        object.__setattr__(self, "_epochs", epochs)

    def __call__(self, epoch: int) -> int:
        return self.points[bisect.bisect_right(self._epochs, epoch) - 1][1]


def run_sizes(value: object, epochs: int, name: str = "image_size") -> "int | dict[int, int]":
    """A run's train sizes as plain data: the size when it is fixed, else {first epoch: size} at each
    change. `value`: a size (an int or its text), "MIN:MAX" (FFCV's ramp over `epochs`: ffcv_ramp), a
    {epoch: size} mapping (keys may be text, as JSON's are), a list of sizes, one an epoch (the last one
    continues), or a function of the epoch (SizeRamp), read over the run's `epochs`. Linear in the
    schedule's length (a SizeRamp: in its sizes); at most MAX_SCHEDULE_EPOCHS epochs named or read."""
    if isinstance(value, str):
        value = _parse_size_text(value, epochs, name)
    if isinstance(value, Mapping):
        points = _mapping_points(value, name)
    elif isinstance(value, (list, tuple)):
        _check_length(len(value), "a list of", name)
        points = {epoch: check_image_size(size, f"{name} of epoch {epoch}") for epoch, size in enumerate(value)}
    elif isinstance(value, SizeRamp):
        points = value.changes(epochs)
    elif callable(value):
        _check_length(epochs, "a function of the epoch read over", name)
        points = {epoch: checked_size(size_at(value, epoch), epoch) for epoch in range(epochs)}
    else:
        return check_image_size(value, name)
    changes: dict[int, int] = {}
    last = None
    for epoch, size in sorted(points.items()):
        if size != last:
            changes[epoch] = last = size
    return changes[0] if len(changes) == 1 else changes


def size_steps(sizes: "int | dict[int, int]") -> "int | SizeSteps":
    """What a loader takes (image_size=) for run_sizes' value."""
    return sizes if isinstance(sizes, int) else SizeSteps(tuple(sorted(sizes.items())))


def last_size(sizes: "int | dict[int, int]") -> int:
    """The size a run_sizes value ends at."""
    return sizes if isinstance(sizes, int) else sizes[max(sizes)]


def sizes_text(sizes: "int | dict[int, int]", most: int = 8) -> str:
    """run_sizes' value for a log line: whole when short, else its first `most` changes, their count and
    the last (a schedule changing at each of 200,000 epochs is not a 2 MB line)."""
    if isinstance(sizes, int) or len(sizes) <= most:
        return str(sizes)
    first = ", ".join(f"{epoch}: {size}" for epoch, size in itertools.islice(sizes.items(), most))
    return f"{{{first}, ...}} ({len(sizes):,} changes; {last_size(sizes)} from epoch {max(sizes):,})"


def _check_length(count: int, what: str, name: str) -> None:
    if count > MAX_SCHEDULE_EPOCHS:
        raise ValueError(f"{name}: {what} {count:,} epochs is over the {MAX_SCHEDULE_EPOCHS:,} a size schedule may "
                         'name; give the sizes where they change, {"0": 160, "10": 192} (epoch: size from then on)')


def _number(text: str) -> int | None:
    """The int that `text` (stripped) writes in ASCII digits, or None: "²" or "٣" are digits to
    str.isdigit(), not to int(); 4,000 digits at most (int() refuses past 4,300)."""
    text = text.strip()
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 4000 else None


def _parse_size_text(text: str, epochs: int, name: str) -> "int | SizeRamp":
    sizes = [_number(part) for part in text.split(":")]
    if len(sizes) > 2 or None in sizes:
        raise ValueError(f"{name} {shown(text)} is neither a size nor MIN:MAX: give e.g. 224, or 160:192 for "
                         "FFCV's ramp from 160 px to 192 px over the run")
    sizes = [check_image_size(size, name) for size in sizes]
    if len(sizes) == 1:
        return sizes[0]
    if sizes[0] > sizes[1]:
        raise ValueError(f"{name} {text.strip()} would shrink the images over the run: give MIN:MAX with MIN <= MAX "
                         f"(e.g. {sizes[1]}:{sizes[0]})")
    return ffcv_ramp(sizes[0], sizes[1], epochs)


def _mapping_points(value: Mapping, name: str) -> dict[int, int]:
    """{epoch: size} from a mapping whose keys are ints or their text; epoch 0 must be named, none twice
    ("1" and "01"), none past MAX_SCHEDULE_EPOCHS."""
    _check_length(len(value), "a schedule of", name)
    points: dict[int, int] = {}
    for key, size in value.items():
        epoch = key if isinstance(key, int) and not isinstance(key, bool) else \
            _number(key) if isinstance(key, str) else None
        if epoch is None or epoch < 0:
            raise ValueError(f"{name}: the schedule's epoch {shown(key)} is not an epoch number (0, 1, ...); "
                             'give {"0": 160, "10": 192} or a list of sizes, one an epoch')
        if epoch >= MAX_SCHEDULE_EPOCHS:
            raise ValueError(f"{name}: the schedule's epoch {shown(key)} is past the {MAX_SCHEDULE_EPOCHS:,} "
                             "epochs a size schedule may name; give epochs a run reaches")
        if epoch in points:
            raise ValueError(f"{name}: the schedule gives epoch {epoch} twice (as {shown(key)} too); keep one")
        points[epoch] = check_image_size(size, f"{name} of epoch {epoch}")
    if 0 not in points:
        raise ValueError(f"{name}: the schedule {shown(value)} does not give epoch 0's size; start it at epoch 0, "
                         'e.g. {"0": 160, "10": 192}')
    return points
