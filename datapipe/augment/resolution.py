"""Progressive resizing: the train image size as a function of the epoch (FFCV's ramp, or yours)."""
from __future__ import annotations

import numbers
from collections.abc import Callable
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
