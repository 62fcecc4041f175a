"""The `sidecars` fuzz target: an image folder's NAME.txt / NAME.json read by the scan (#38 row 3),
the input deciding their bytes and whether they are links out of the dataset or FIFOs.
fuzz/targets.py registers it."""
from __future__ import annotations

import atexit
import json
import shutil
import tempfile
import time
from pathlib import Path

from fuzz.contract import Finding, Target, timed

# Self-contained: its seeds, check and registration. An input is one flag byte, then the caption's
# bytes, "\n--\n", the metadata's bytes. Flag bits: 1 writes NAME.txt, 2 NAME.json, 4 makes NAME.txt
# a link to a file outside the dataset, 8 makes NAME.json a FIFO, 16 makes NAME.txt a link to
# /dev/zero, 32 makes NAME.txt a link inside the dataset.

SIDECAR_SECRET = b"not a caption: a file outside the dataset"
_SIDECAR_DIR: Path | None = None


def _sidecar_dir() -> Path:
    """tmp/outside (the file links point out to) and tmp/ds/c/x.jpg (the image; its bytes are never
    decoded by the scan), made once per process."""
    global _SIDECAR_DIR
    if _SIDECAR_DIR is None:
        _SIDECAR_DIR = Path(tempfile.mkdtemp(prefix="datapipe-fuzz-sidecars-"))
        atexit.register(shutil.rmtree, _SIDECAR_DIR, True)
        (_SIDECAR_DIR / "outside").write_bytes(SIDECAR_SECRET)
        (_SIDECAR_DIR / "ds" / "c").mkdir(parents=True)
        (_SIDECAR_DIR / "ds" / "c" / "x.jpg").write_bytes(b"\xff\xd8\xff\xd9")
    return _SIDECAR_DIR


def sidecar_seeds() -> list[bytes]:
    meta = json.dumps({"url": "http://x.example/é.jpg", "tags": ["a", None], "w": 1.5}).encode()
    bodies = (b"a caption\n--\n" + meta, "caf\u00e9 au lait\r\n--\n{}".encode(), b"caf\xe9\n--\n[1, 2]",
              b"\n--\n" + b"[" * 3000 + b"]" * 3000, b"x" * 300 + b"\n--\n{\"a\": 1e999}")
    return [bytes([flags]) + body for flags in (1, 2, 3, 5, 11, 17, 33, 35) for body in bodies]


def _plant_sidecars(data: bytes) -> tuple[Path, int]:
    """The folder with x.txt / x.json as the input says; (its root, the flag byte)."""
    import os

    tmp = _sidecar_dir()
    flags, (text, _, meta) = (data[0] if data else 0), data[1:].partition(b"\n--\n")
    folder = tmp / "ds" / "c"
    for name in ("x.txt", "x.json", "inside.txt"):
        (folder / name).unlink(missing_ok=True)
    (folder / "inside.txt").write_bytes(text)
    if flags & 1:
        txt = folder / "x.txt"
        if flags & 4:
            txt.symlink_to(tmp / "outside")
        elif flags & 16:
            txt.symlink_to("/dev/zero")
        elif flags & 32:
            txt.symlink_to("inside.txt")
        else:
            txt.write_bytes(text)
    if flags & 2:
        os.mkfifo(folder / "x.json") if flags & 8 else (folder / "x.json").write_bytes(meta)
    return tmp / "ds", flags


def check_sidecars(data: bytes) -> None:
    """scan_folder over one image and its sidecars: the image is in the split with the fields
    field_text makes of the bytes, or skipped with a one-line reason naming its sidecar; a link out
    of the dataset, /dev/zero or a FIFO is always skipped (never read, never blocking); nothing else
    raised, in time, within the memory bound."""
    import re

    from datapipe.formats import field_text
    from datapipe.records import Fields
    from datapipe.formats.scan import scan_folder

    root, flags = _plant_sidecars(data)
    start = time.process_time()
    layout = scan_folder(root)
    timed("sidecars", start)
    files, skipped = layout.splits["train"], layout.skipped["train"]
    if skipped:
        reason = skipped[0]["reason"]
        named = re.match(r"(caption |metadata )?c/x\.(txt|json) ", reason)
        if len(skipped) != 1 or files or "\n" in reason or not named:
            raise Finding(f"the bad sidecar's skip is not one line naming it: {skipped!r:.300}")
        return
    if flags & 1 and flags & 20 or flags & 2 and flags & 8:
        raise Finding(f"a sidecar linking out of the dataset or to a FIFO was read (flags {flags})")
    text, _, meta = data[1:].partition(b"\n--\n")
    want = Fields(field_text.caption(text, "t", strip_newline=True) if flags & 1 else None,
                  field_text.metadata(meta, "m") if flags & 2 else None)
    got = files[0].fields
    if (got.text, got.meta) != (want.text, want.meta):
        raise Finding(f"fields {got!r:.200} read from sidecars that make {want!r:.200}")


TARGET = Target("sidecars", check_sidecars, sidecar_seeds,
                             ("datapipe.formats.scan", "datapipe.storage.dataset_files", "datapipe.formats.field_text", "json"),
                             memory=(64, 4 << 20))
