"""The surfaces the docs walk of README, converting, training, benchmarking, clusters and loaders touched:
a resume's TensorBoard clean-up (`datapipe.train.board.drop_past`) over event folders a careless user or
a crash left (garbage, a record whose length field lies, a FIFO, a folder or a link named like an event
file), `doctor` without a GPU, bench's too-short notes on tiny data, and the Parquet scan's log line."""
from __future__ import annotations

import os
from pathlib import Path

from tools.adversarial.harness import FIXTURES, Case

BIG = 16384  # MB of address space: torch and tensorboard map far more than they touch
DROP = ("import logging, sys; logging.basicConfig(level=logging.INFO); from pathlib import Path; "
        "from datapipe.train.board import drop_past; drop_past(Path('{tmp}/tb'), 3, 1); print('done')")
EVENTS = "events.out.tfevents.1.host.1.0"


def board(tmp: Path) -> Path:
    (tmp / "tb").mkdir()
    return tmp / "tb"


def real_events(tmp: Path) -> None:
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(log_dir=str(board(tmp)))
    for step in range(1, 8):
        writer.add_scalar("train/loss\x1b[2J", 1.0, step)  # a tag with an escape: never printed
    writer.close()


def lying_length(tmp: Path) -> None:
    import struct

    (board(tmp) / EVENTS).write_bytes(struct.pack("<QI", 2**63, 0) + b"x" * 64)  # says 8 EB follow


def garbage(tmp: Path) -> None:
    (board(tmp) / EVENTS).write_bytes(os.urandom(4096))


def fifo(tmp: Path) -> None:
    os.mkfifo(board(tmp) / EVENTS)


def folder(tmp: Path) -> None:
    (board(tmp) / EVENTS).mkdir()


def link_to_zero(tmp: Path) -> None:
    (board(tmp) / EVENTS).symlink_to("/dev/zero")


def tiny_lmdb(tmp: Path) -> None:
    from converters import ConvertOptions, convert

    src = tmp / "src" / "train" / "cat"
    src.mkdir(parents=True)
    (src / "a.jpg").write_bytes((FIXTURES / "imagefolder/train/cat/cat_000.jpg").read_bytes())
    convert(tmp / "src", tmp / "one.lmdb", ConvertOptions(progress=False, workers=1))


def one_parquet(tmp: Path) -> None:
    from tests.parquet_data import TRAIN, write_hub

    write_hub(tmp / "data")
    for name in os.listdir(tmp / "data"):
        if name != TRAIN:
            os.remove(tmp / "data" / name)


CASES = [
    Case("drop_past over a crashed run's events (escape in a tag)", code=DROP, setup=real_events, expect="ok",
         mem_mb=BIG),
    Case("drop_past: a record whose length field says 8 EB", code=DROP, setup=lying_length, expect="ok", mem_mb=BIG),
    Case("drop_past: random bytes named as an event file", code=DROP, setup=garbage, expect="ok", mem_mb=BIG),
    Case("drop_past: a FIFO named as an event file", code=DROP, setup=fifo, expect="either", timeout_s=30,
         mem_mb=BIG),
    Case("drop_past: a folder named as an event file", code=DROP, setup=folder, expect="either", mem_mb=BIG),
    Case("drop_past: an event file linked to /dev/zero", code=DROP, setup=link_to_zero, expect="either",
         timeout_s=30, mem_mb=BIG),
    Case("doctor without a GPU", argv=["datapipe", "doctor"], expect="ok"),
    Case("doctor --json without a GPU", argv=["datapipe", "doctor", "--json"], expect="ok"),
    Case("bench on a one-record dataset", argv=["datapipe", "bench", "{tmp}/one.lmdb", "--batch-size", "1",
                                                "--seconds", "0.2", "--repeats", "1", "--suites", "pipeline",
                                                "--backends", "threads"],
         setup=tiny_lmdb, expect="refused", timeout_s=120, mem_mb=BIG),
    Case("bench at batch 1, 1 worker, one record", argv=["datapipe", "bench", "{tmp}/one.lmdb", "--batch-size", "1",
                                                         "--workers", "1", "--seconds", "0.2", "--repeats", "1",
                                                         "--suites", "read,decode,pipeline", "--backends", "threads"],
         setup=tiny_lmdb, expect="either", timeout_s=120, mem_mb=BIG),
    Case("convert one Parquet file", argv=["datapipe", "convert", "{tmp}/data", "{tmp}/out.wds", "-q"],
         setup=one_parquet, expect="ok", timeout_s=120, mem_mb=BIG),
    Case("train --help", argv=["datapipe", "train", "--help"], expect="ok", mem_mb=BIG),
]
