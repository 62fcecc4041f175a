"""Progressive resizing: the train image size as a function of the epoch (FFCV's ramp, or yours)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


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
        if not 8 <= self.min_size <= self.max_size or self.step < 1 or not 0 <= self.start_epoch <= self.end_epoch:
            raise ValueError(f"SizeRamp needs 8 <= min_size <= max_size, step >= 1, 0 <= start_epoch <= end_epoch; "
                             f"got {self}")

    def __call__(self, epoch: int) -> int:
        if epoch <= self.start_epoch:
            return self.min_size
        if epoch >= self.end_epoch:
            return self.max_size
        share = (epoch - self.start_epoch) / (self.end_epoch - self.start_epoch)
        size = self.min_size + share * (self.max_size - self.min_size)
        return int(round(size / self.step)) * self.step


def size_schedule(value: "int | Callable[[int], int]") -> Callable[[int], int]:
    """An epoch -> size function from a fixed size or a function (checked on use)."""
    if isinstance(value, int):
        return lambda epoch: value
    if callable(value):
        return value
    raise ValueError(f"image_size must be an int or a function of the epoch (e.g. SizeRamp), got {value!r}")


def checked_size(size: object, epoch: int) -> int:
    if not isinstance(size, int) or size < 8:
        raise ValueError(f"the image size schedule gave {size!r} for epoch {epoch}: it must return an int >= 8")
    return size
