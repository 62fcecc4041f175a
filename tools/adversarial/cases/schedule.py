"""`datapipe train --image-size-schedule FILE` and the image size schedule given in Python (#47 rows 5-6,
item 4), tried as a careless user and as someone handing over a hostile schedule file: a FIFO, /dev/zero,
a 1 GB file, arrays nested 100,000 deep, 200,000 alternating sizes, keys that are not epochs, terminal
escapes in keys and in the path, a function that raises or gives junk, a million-entry list, 10**9 epochs.
The schedule is read before the data is opened, so most cases need no dataset."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

from tools.adversarial.harness import FIXTURES, Case

BIG = 16384  # MB of address space: torch maps far more than it touches
ESC = "\x1b]0;pwned\x07\x1b[2J\x1b[H\u202e"


def written(body: "bytes | str", name: str = "sizes.json"):
    def make(tmp: Path) -> None:
        (tmp / name).write_bytes(body.encode() if isinstance(body, str) else body)
    return make


def sparse(size: int):
    def make(tmp: Path) -> None:
        with open(tmp / "sizes.json", "wb") as fh:
            fh.truncate(size)
    return make


def clean_run(tmp: Path) -> None:
    """The schedule {"0": 32, "1": 40} and data/: the fixture folder's plain JPEGs (NAME_NNN.jpg), linked."""
    written('{"0": 32, "1": 40}')(tmp)
    for image in (FIXTURES / "imagefolder").glob("*/*/*.jpg"):
        if re.fullmatch(r"[a-z]+_\d{3}\.jpg", image.name):
            folder = tmp / "data" / image.parent.relative_to(FIXTURES / "imagefolder")
            folder.mkdir(parents=True, exist_ok=True)
            (folder / image.name).symlink_to(image)


def cli(name: str, setup, *, expect: str = "refused", path: str = "{tmp}/sizes.json", extra=(), mem_mb: int = BIG):
    return Case(name, argv=["datapipe", "train", "{tmp}/data", "--out", "{tmp}/run", *extra,
                            "--image-size-schedule", path], setup=setup, expect=expect, timeout_s=90, mem_mb=mem_mb)


def api(name: str, image_size: str, *, epochs: str = "5", expect: str = "refused") -> Case:
    """TrainConfig(image_size=...) in Python: a ValueError caught and printed as one line, else the sizes' count."""
    code = ("import math\nfrom datapipe.train.config import TrainConfig\n"
            f"try:\n    c = TrainConfig(data='d', out='o', image_size={image_size}, epochs={epochs})\n"
            "    print('accepted', c.image_size if isinstance(c.image_size, int) else len(c.image_size))\n"
            "except ValueError as exc:\n    print('refused:', exc)\n    raise SystemExit(2)\n")
    return Case(name, code=code, expect=expect, timeout_s=90, mem_mb=BIG)


CASES = [
    cli("a FIFO", lambda tmp: os.mkfifo(tmp / "sizes.json")),
    cli("a link to /dev/zero", lambda tmp: (tmp / "sizes.json").symlink_to("/dev/zero"), mem_mb=2048),
    cli("/dev/stdin (a pipe here)", None, path="/dev/stdin"),
    cli("a folder", lambda tmp: (tmp / "sizes.json").mkdir()),
    cli("a 1 GB sparse file, under 1 GB of address space", sparse(1 << 30), mem_mb=1024),
    cli("arrays nested 100,000 deep", written(b"[" * 100_000 + b"]" * 100_000)),
    cli("objects nested 100,000 deep, unclosed", written(b'{"0":' * 100_000)),
    cli("200,000 alternating sizes (2 MB): read, then a missing dataset", written(json.dumps([160, 192] * 100_000))),
    cli("2,000,000 sizes in 4 MB: over the epochs a schedule may name", written("[" + "8," * 1_999_999 + "8]")),
    cli("an epoch key of 10**9 and one of 5,000 digits",
        written('{"0": 160, "1000000000": 192, "' + "9" * 5000 + '": 1}')),
    cli("keys with terminal escapes", written(json.dumps({"0": 160, ESC: 192}))),
    cli("a path with terminal escapes", written("[7]", name=f"s{ESC}.json"), path="{tmp}/s" + ESC + ".json"),
    cli("superscript and Arabic-Indic digits as epochs", written('{"0": 160, "\u00b2": 192, "\u0663": 224}')),
    cli("one epoch twice, as 0 and 00", written('{"0": 160, "00": 192}')),
    cli("a key given twice", written('{"0": 160, "0": 192}')),
    cli("NaN, Infinity, floats, true, null as sizes", written("[160, NaN, Infinity, 192.0, true, null]")),
    cli("a 5,000-digit size", written("[" + "9" * 5000 + "]")),
    cli("null", written("null")),
    cli("Latin-1 bytes", written(b'{"0": 160, "\xe9t\xe9": 192}')),
    cli("a UTF-16 file", written('{"0": 160}'.encode("utf-16"))),
    cli("a missing file", None),
    cli("the secrets' file as the schedule", written("HF_TOKEN=hf_CANARYtok3nNeverPrint01\n")),
    cli("/proc/self/environ (the secrets)", None, path="/proc/self/environ"),
    cli("a valid schedule over the fixture's clean images", clean_run, expect="ok",
        extra=["--model", "resnet18", "--epochs", "2", "--batch-size", "4", "--workers", "0", "--backend",
               "dataloader", "--tensorboard", "off"]),
    cli("200,000 alternating sizes over the fixture's clean images (the log names the sizes)",
        lambda tmp: (clean_run(tmp), written(json.dumps([32, 40] * 100_000))(tmp)), expect="ok",
        extra=["--model", "resnet18", "--epochs", "1", "--max-steps", "1", "--batch-size", "4", "--workers", "0",
               "--backend", "dataloader", "--tensorboard", "off"]),
    api("a function that raises", "lambda e: 1 // 0"),
    api("a function giving floats", "lambda e: 160.0"),
    api("a function giving NaN", "lambda e: math.nan"),
    api("a function giving a bool", "lambda e: True"),
    api("a function giving a negative size", "lambda e: -160"),
    api("a function giving a 100,000-digit int", "lambda e: 10**100_000"),
    api("a function giving a list nested 5,000 deep",
        "lambda e, deep=__import__('functools').reduce(lambda v, _: [v], range(5000), 160): deep"),
    api("a function read over 10**9 epochs", "lambda e: 160", epochs="10**9"),
    api("FFCV's ramp over 10**9 epochs", "'160:192'", epochs="10**9", expect="ok"),
    api("a dict with 10**9 as an epoch", "{0: 160, 10**9: 192}"),
    api("a list of 50,000,000 sizes", "[160] * 50_000_000"),
    api("a million alternating sizes", "[8, 16] * 500_000", expect="ok"),
]
