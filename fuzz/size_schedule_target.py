"""The `size_schedule` fuzz target: `datapipe train --image-size-schedule FILE` (#47 rows 5-6), the
file's bytes from the input, the flag byte making it a FIFO, a link to /dev/zero or a file past the
size bound. fuzz/targets.py registers it.

An input is one flag byte, then the file's bytes. Flag bits: 1 makes the file a FIFO, 2 a link to
/dev/zero, 4 pads it (sparse) to one byte past SCHEDULE_MAX_BYTES; the epochs of the run are 1 + the
flag byte's top four bits. The oracle: size_schedule_file refuses in one printable line naming the file
(a FIFO, a device or a file past the bound always refused, never read), or gives a value TrainConfig
accepts, whose sizes are the file's own: an int, or {first epoch: size} from epoch 0 at each change,
each within MIN..MAX_IMAGE_SIZE, read back by the loader's step schedule at every epoch named; in time
and within the memory bound.
"""
from __future__ import annotations

import atexit
import json
import shutil
import tempfile
import time
from pathlib import Path

from fuzz.contract import Finding, Target, timed

_DIR: Path | None = None
# What the refusal says for each planted kind (flag bits 1, 2, 4; a FIFO or a link wins over the padding)
_WHY = {1: " is a FIFO, not a regular file", 2: " is a character device, not a regular file", 4: " bytes, over the "}
_WHY.update({3: _WHY[1], 5: _WHY[1], 7: _WHY[1], 6: _WHY[2]})


def _folder() -> Path:
    global _DIR
    if _DIR is None:
        _DIR = Path(tempfile.mkdtemp(prefix="datapipe-fuzz-schedule-"))
        atexit.register(shutil.rmtree, _DIR, True)
    return _DIR


def size_schedule_seeds() -> list[bytes]:
    """Schedules as people write them, and as they go wrong; imports TrainConfig (torch) before any check
    is measured."""
    from datapipe.train.config import TrainConfig  # noqa: F401 - loaded here, not inside a measured check

    bodies = [json.dumps({"0": 128, "10": 160, "20": 192}).encode(), b"[160, 160, 192, 192, 224]",
              b'\xef\xbb\xbf{"0": 160, " 3 ": 192}\n', b'"160:192"', b"224", b'{"1": 32}', b'{"0": 16, "00": 32}',
              b'{"0": 16, "0": 32}', b"[160, 192.0, NaN, true, null]", b"[" * 2000 + b"]" * 2000, b"null",
              b'{"0": 160, "\\u00b2": 192, "1048576": 8}', b"[" + b"9" * 5000 + b"]", b"[8, 16]" * 3,
              json.dumps([8, 16] * 500).encode(), b'{"0": 8192, "5": 8, "6": 8193}', b"\xff\xfe[\x00]\x00"]
    return [bytes([flags]) + body for flags in (0, 0x30, 0xF0, 1, 2, 4) for body in bodies]


def _plant(data: bytes) -> tuple[Path, int]:
    """The schedule file as the input says; (its path, the flag byte)."""
    import os

    from datapipe.cli.train import SCHEDULE_MAX_BYTES

    flags, path = (data[0] if data else 0), _folder() / "sizes.json"
    path.unlink(missing_ok=True)
    if flags & 1:
        os.mkfifo(path)
    elif flags & 2:
        path.symlink_to("/dev/zero")
    else:
        with open(path, "wb") as fh:
            fh.write(data[1:])
            if flags & 4:
                fh.truncate(SCHEDULE_MAX_BYTES + 1)
    return path, flags


def _changes(value: object) -> object:
    """What the file says, read the plain way: {epoch: size} at each change, or the one size."""
    if isinstance(value, (int, str)):
        return None  # a size or MIN:MAX: their checks are run_sizes' own (tests/train/test_train_sizes.py)
    items = enumerate(value) if isinstance(value, list) else ((int(k), s) for k, s in value.items())
    changes, last = {}, None
    for epoch, size in sorted(items):
        if size != last:
            changes[epoch] = last = size
    return changes[0] if len(changes) == 1 else changes


def check_size_schedule(data: bytes) -> None:
    import argparse

    from datapipe.augment.resolution import MAX_IMAGE_SIZE, MIN_IMAGE_SIZE
    from datapipe.cli.train import size_schedule_file
    from datapipe.train.config import TrainConfig

    path, flags = _plant(data)
    start = time.process_time()
    try:
        value = size_schedule_file(argparse.Namespace(image_size_schedule=str(path)))
    except ValueError as exc:
        said, why = str(exc), _WHY[flags & 7] if flags & 7 else ""
        if not said.startswith(f"--image-size-schedule {path}") or not said.isprintable() or len(said) > 600:
            raise Finding(f"the refusal is not one printable line naming the file: {said!r:.300}") from None
        if why not in said:
            raise Finding(f"a FIFO, a device or a file past the bound refused for another reason: {said!r:.300}")
        timed("size_schedule", start)
        return
    if flags & 7:
        raise Finding(f"a FIFO, a device or a file past the bound was read (flags {flags})")
    config = TrainConfig(data="d", out="o", image_size=value, epochs=1 + (flags >> 4))
    sizes, steps = config.image_size, config.train_sizes
    timed("size_schedule", start)
    plain = _changes(value)
    named = {0: sizes} if isinstance(sizes, int) else sizes
    epochs = list(named)
    fits = all(type(s) is int and MIN_IMAGE_SIZE <= s <= MAX_IMAGE_SIZE for s in named.values())
    ordered = epochs == sorted(epochs) and epochs[0] == 0 and (isinstance(sizes, int) or len(epochs) > 1)
    if not (fits and ordered) or plain not in (None, sizes) or any(steps(e) != s for e, s in named.items() if e):
        raise Finding(f"the schedule {value!r:.200} gave {sizes!r:.200}, the file says {plain!r:.200}")


TARGET = Target("size_schedule", check_size_schedule, size_schedule_seeds,
                ("datapipe.cli.train", "datapipe.augment.resolution", "datapipe.storage.dataset_files", "json"),
                memory=(256, 1 << 20))
