"""Progressive resizing: the train image size as a function of the epoch (FFCV's ramp, a step schedule,
or yours), and a run's sizes as plain data (`datapipe train`: run_sizes)."""
from __future__ import annotations

import bisect
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ..checks import integer, shown

MIN_IMAGE_SIZE = 8
# The largest side a loader serves: a float32 batch of 64 at 8192 x 8192 is already 51 GB (at 16384,
# 206 GB); past it a typo (image_size=10**5: a 1.75 TiB batch) would reach the allocator.
MAX_IMAGE_SIZE = 8192
SIZE_RULE = f"pixels a side, at most MAX_IMAGE_SIZE={MAX_IMAGE_SIZE}"


def check_image_size(value: object, name: str = "image_size") -> int:
    """An image size: an int (not a bool) within MIN_IMAGE_SIZE..MAX_IMAGE_SIZE; else one line naming it."""
    return integer(name, value, MIN_IMAGE_SIZE, MAX_IMAGE_SIZE, note=f", {SIZE_RULE}")


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
            raise ValueError(f"SizeRamp needs min_size <= max_size and start_epoch <= end_epoch; got {self}")

    def __call__(self, epoch: int) -> int:
        if epoch <= self.start_epoch:
            return self.min_size
        if epoch >= self.end_epoch:
            return self.max_size
        share = (epoch - self.start_epoch) / (self.end_epoch - self.start_epoch)
        size = self.min_size + share * (self.max_size - self.min_size)
        # within min..max even where step does not divide them (8 -> 16 by 32 rounded to 0)
        return max(self.min_size, min(self.max_size, int(round(size / self.step)) * self.step))


def size_schedule(value: "int | Callable[[int], int]") -> Callable[[int], int]:
    """An epoch -> size function from a fixed size (checked now) or a function (each size it gives
    checked when it is called, naming the epoch: checked_size)."""
    if isinstance(value, int):
        size = check_image_size(value)
        return lambda epoch: size
    if callable(value):
        return lambda epoch: checked_size(value(epoch), epoch)
    raise ValueError(f"image_size must be an int or a function of the epoch (e.g. SizeRamp), got {shown(value)}")


def checked_size(size: object, epoch: int) -> int:
    """A size an image size schedule gave for `epoch`: an int (not a bool) within MIN..MAX_IMAGE_SIZE."""
    if isinstance(size, numbers.Integral) and not isinstance(size, bool) and MIN_IMAGE_SIZE <= size <= MAX_IMAGE_SIZE:
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

    def __post_init__(self) -> None:
        epochs = [epoch for epoch, _ in self.points]
        if not epochs or epochs[0] != 0 or epochs != sorted(set(epochs)):
            raise ValueError(f"SizeSteps needs points at increasing epochs from epoch 0, got {shown(self.points)}")

    def __call__(self, epoch: int) -> int:
        return self.points[bisect.bisect_right([e for e, _ in self.points], epoch) - 1][1]


def run_sizes(value: object, epochs: int, name: str = "image_size") -> "int | dict[int, int]":
    """A run's train sizes as plain data: the size when it is fixed, else {first epoch: size} at each
    change. `value`: a size (an int or its text), "MIN:MAX" (FFCV's ramp over `epochs`: ffcv_ramp), a
    {epoch: size} mapping (keys may be text, as JSON's are), a list of sizes, one an epoch (the last one
    continues), or a function of the epoch (SizeRamp), read over the run's `epochs`."""
    if isinstance(value, str):
        value = _parse_size_text(value, epochs, name)
    if isinstance(value, Mapping):
        points = _mapping_points(value, name)
    elif isinstance(value, (list, tuple)):
        points = _mapping_points(dict(enumerate(value)), name)
    elif callable(value):
        points = {epoch: checked_size(value(epoch), epoch) for epoch in range(epochs)}
    else:
        return check_image_size(value, name)
    changes: dict[int, int] = {}
    for epoch, size in sorted(points.items()):
        if not changes or size != last_size(changes):
            changes[epoch] = size
    return changes[0] if len(changes) == 1 else changes


def size_steps(sizes: "int | dict[int, int]") -> "int | SizeSteps":
    """What a loader takes (image_size=) for run_sizes' value."""
    return sizes if isinstance(sizes, int) else SizeSteps(tuple(sorted(sizes.items())))


def last_size(sizes: "int | dict[int, int]") -> int:
    """The size a run_sizes value ends at."""
    return sizes if isinstance(sizes, int) else sizes[max(sizes)]


def _parse_size_text(text: str, epochs: int, name: str) -> "int | SizeRamp":
    parts = text.strip().split(":")
    if len(parts) > 2 or not all(part.strip().isdigit() for part in parts):
        raise ValueError(f"{name} {shown(text)} is neither a size nor MIN:MAX: give e.g. 224, or 160:192 for "
                         "FFCV's ramp from 160 px to 192 px over the run")
    sizes = [check_image_size(int(part), name) for part in parts]
    if len(sizes) == 1:
        return sizes[0]
    if sizes[0] > sizes[1]:
        raise ValueError(f"{name} {text} would shrink the images over the run: give MIN:MAX with MIN <= MAX "
                         f"(e.g. {sizes[1]}:{sizes[0]})")
    return ffcv_ramp(sizes[0], sizes[1], epochs)


def _mapping_points(value: Mapping, name: str) -> dict[int, int]:
    """{epoch: size} from a mapping whose keys are ints or their text; epoch 0 must be named."""
    points: dict[int, int] = {}
    for key, size in value.items():
        text = str(key).strip()
        if isinstance(key, bool) or not (isinstance(key, int) or text.isdigit()):
            raise ValueError(f"{name}: the schedule's epoch {shown(key)} is not an epoch number (0, 1, ...); "
                             'give {"0": 160, "10": 192} or a list of sizes, one an epoch')
        points[int(text)] = check_image_size(size, f"{name} of epoch {text}")
    if 0 not in points:
        raise ValueError(f"{name}: the schedule {shown(value)} does not give epoch 0's size; start it at epoch 0, "
                         'e.g. {"0": 160, "10": 192}')
    return points
