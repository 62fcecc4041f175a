"""`datapipe info A B --weights` as the docs walk it (docs/mixing.md): the mix table's rendering, tried as a
careless user and a hostile author of the names and paths it shows (names shorter than its header, long,
wide, empty, with escapes; many sources; an epoch of 1 or 10^18; a weight of 0). The mix's own inputs
(weights, epoch sizes, class names, states) are cases/mix.py's."""
from __future__ import annotations

import os

from tools.adversarial.cases.mix import BIG, _packed, info, packed
from tools.adversarial.harness import Case


EVIL = "evil\x1b[2J\x1b]0;pwned\x07.lmdb"
SMALL = ["--epoch-size", "8", "--model", "resnet18", "--epochs", "1", "--batch-size", "4", "--image-size", "32",
         "--workers", "0", "--max-steps", "1", "--out", "run"]


def many(count: int):
    """setup: `count` links to the packed sources, s0.lmdb, s1.wds, ..."""
    def make(tmp) -> None:
        for i in range(count):
            name = ("a.lmdb", "b.wds")[i % 2]
            os.symlink(_packed() / name, tmp / f"s{i}{name[1:]}")
    return make


def escaped(tmp) -> None:
    """setup: a.lmdb and b.wds, and a link to a.lmdb whose name clears the screen and retitles the terminal."""
    packed(tmp)
    os.symlink(_packed() / "a.lmdb", tmp / EVIL)


def named(*names: str, expect: str = "ok", extra: tuple[str, ...] = ()):
    """info over a.lmdb and b.wds given the names `names` (NAME=PATH)."""
    argv = ["datapipe", "info", f"{names[0]}=a.lmdb", f"{names[1]}=b.wds", "--weights", "0.7,0.3", *extra]
    return Case(f"names {names!r}"[:80], argv=argv, setup=packed, expect=expect, timeout_s=90, mem_mb=BIG)


def all_of(count: int):
    argv = ["datapipe", "info", *[f"s{i}{('.lmdb', '.wds')[i % 2]}" for i in range(count)]]
    return Case(f"{count} sources", argv=argv, setup=many(count), expect="ok", timeout_s=180, mem_mb=BIG)


CASES = [
    named("a", "b"),  # shorter than the header: the figures stay under it
    named("in1k", "web", extra=("--epoch-size", "1")),  # '1 sample an epoch', a draw of 0: 'never'
    named("x" * 2000, "web"),  # a 2,000-character name: the table is as wide as the name, no wider
    named("\x1b]0;pwned\x07", "\x1b[2J", expect="refused"),  # not a NAME: a path that is not there, shown as text
    named("", "web", expect="either"),  # an empty name
    named("source", "source"),  # the header's word twice: the second is renamed
    named("名前", "ｗｅｂ", expect="refused"),  # not a NAME (ASCII letters, digits, _.-): a path not there
    named("a b", "c\nd", expect="either"),  # a space and a line break in names
    named("in1k", "web", extra=("--epoch-size", str(10**18))),  # figures with 19 digits and separators
    named("in1k", "web", extra=("--json",)),
    info("a weight of 0 (never repeats)", "--weights", "0,1", expect="ok"),
    info("an epoch of 1", "--epoch-size", "1", expect="ok"),
    all_of(40),
    Case("info over a file whose name holds escapes", argv=["datapipe", "info", EVIL, "b.wds"], setup=escaped,
         expect="ok", timeout_s=90, mem_mb=BIG),
    Case("train over a file whose name holds escapes", argv=["datapipe", "train", EVIL, "b.wds", *SMALL],
         setup=escaped, expect="ok", timeout_s=180, mem_mb=BIG),
    Case("preview over a file whose name holds escapes", setup=escaped, expect="ok", timeout_s=120, mem_mb=BIG,
         argv=["datapipe", "preview", EVIL, "b.wds", "--records", "2", "--epochs", "1", "--backends", "threads",
               "--out", "p.png"]),
    Case("train over 40 sources (the banner names each)", setup=many(40), expect="ok", timeout_s=240, mem_mb=BIG,
         argv=["datapipe", "train", *[f"s{i}{('.lmdb', '.wds')[i % 2]}" for i in range(40)], *SMALL]),
]
