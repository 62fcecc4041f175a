"""Issue #48's surfaces: `convert A.lmdb B.wds` (a repack of a packed dataset), `doctor DATA`, `info`'s class
names, `preview`'s recipe flags and the scan's dangling links, tried as a hostile dataset author (crafted
LMDB records and manifests, names with terminal escapes) and a careless user (odd paths, bad values)."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from tools.adversarial.harness import FIXTURES, Case

IMAGES = FIXTURES / "imagefolder"
JPEG = (IMAGES / "train/cat/cat_000.jpg").read_bytes()


def crafted_lmdb(root: Path, *, key: str = "k0", label: int = 0, classes: list[str] | None = None, fields=None,
                 samples: int | None = None, records: int = 1, path: object = "a.jpg") -> Path:
    """An LMDB dataset written by datapipe's own writer whose one split holds what a hostile author chose,
    each record's checksum right (so only the repack's own checks can refuse it)."""
    from datapipe.formats.lmdb import LmdbWriter
    from datapipe.records import NO_FIELDS, Manifest, Record, SplitInfo, record_digest

    fields = fields or NO_FIELDS
    dst, staging = root / "src.lmdb", root / "src.lmdb.partial"
    writer = LmdbWriter(staging, size_hint=1 << 20, shard_bytes=0)
    info = SplitInfo()
    for i in range(records):
        k = key if records == 1 else f"{key}{i}" if key != "dup" else "dup"
        record = Record(k, JPEG, label, path, record_digest(k, label, JPEG, fields), fields)  # type: ignore[arg-type]
        writer.write("train", i, record)
        info.add(record)
    if samples is not None:
        info.samples = samples
    writer.close(Manifest("lmdb", classes or ["a", "b"], {"train": info}))
    staging.rename(dst)
    return dst


def packed(root: Path, suffix: str = ".lmdb") -> Path:
    from converters import ConvertOptions, convert

    dst = root / f"src{suffix}"
    convert(IMAGES, dst, ConvertOptions(progress=False, workers=1, shard_bytes=64 << 10))
    return dst


def with_manifest(root: Path, change) -> None:
    dst = packed(root)
    body = json.loads((dst / "manifest.json").read_text())
    change(body)
    (dst / "manifest.json").write_text(json.dumps(body))


def escaped_classes(root: Path) -> None:
    src = root / "src"
    for name in ("\x1b[2J\x1b[31mred", "bell\x07", "x" * 250):
        (src / "train" / name).mkdir(parents=True)
        shutil.copy(IMAGES / "train/cat/cat_000.jpg", src / "train" / name / "a.jpg")
    (src / "train" / "bell\x07" / "bad\x1b[5m.jpg").write_bytes(b"not an image")
    os.symlink("/nowhere/\x1b[31m", src / "train" / "gone\x1b]0;title\x07")


def damaged_progress(root: Path) -> None:
    packed(root)
    staging = root / "out.wds.partial"
    staging.mkdir()
    (staging / "progress.json").write_text("{}")


def huge_staged_count(root: Path) -> None:
    packed(root)
    staging = root / "out.h5.partial"
    staging.mkdir()
    (staging / "progress.json").write_text(json.dumps({"fingerprint": "x", "arguments": {}, "done": -5, "splits": {}}))


CONVERT = ["datapipe", "convert", "{tmp}/src.lmdb", "{tmp}/out.wds", "-q"]
PREVIEW = ["datapipe", "preview", "{fixtures}/imagefolder", "--out", "{tmp}/p.png", "--records", "2", "--epochs", "1",
           "--backends", "threads", "--image-size", "16"]

CASES = [
    # a hostile dataset author: crafted records and manifests, each record's checksum right
    Case("repack: a key that climbs out of the shard", argv=CONVERT, setup=lambda t: crafted_lmdb(t, key="../../x")),
    Case("repack: a key with a dot and a NUL", argv=CONVERT, setup=lambda t: crafted_lmdb(t, key="a.jpg\0")),
    Case("repack: a key of 10,000 characters", argv=CONVERT, setup=lambda t: crafted_lmdb(t, key="k" * 10_000)),
    Case("repack: a label of 10^12", argv=CONVERT, setup=lambda t: crafted_lmdb(t, label=10**12)),
    Case("repack: a negative label", argv=CONVERT, setup=lambda t: crafted_lmdb(t, label=-1)),
    Case("repack: multi-labels past the classes, into HDF5", argv=["datapipe", "convert", "{tmp}/src.lmdb",
         "{tmp}/out.h5", "-q"], setup=lambda t: crafted_lmdb(t, fields=_fields(labels=(0, 2**40)))),
    Case("repack: a caption that is a number", argv=CONVERT, setup=lambda t: crafted_lmdb(t, fields=_fields(text=5))),
    Case("repack: a path that is a list, into HDF5", argv=["datapipe", "convert", "{tmp}/src.lmdb", "{tmp}/out.h5"],
         setup=lambda t: crafted_lmdb(t, path=["a"])),
    Case("repack: one key on every record", argv=CONVERT, setup=lambda t: crafted_lmdb(t, key="dup", records=3)),
    Case("repack: a manifest claiming 10^12 records", argv=CONVERT, setup=lambda t: crafted_lmdb(t, samples=10**12)),
    Case("repack: a manifest claiming more records than stored", argv=CONVERT,
         setup=lambda t: crafted_lmdb(t, samples=5, records=2)),
    Case("repack: a manifest of an unknown format", argv=CONVERT,
         setup=lambda t: with_manifest(t, lambda b: b.update(format="tfrecord"))),
    Case("repack: a manifest whose classes are not a list", argv=CONVERT,
         setup=lambda t: with_manifest(t, lambda b: b.update(classes={"a": 1}))),
    Case("repack: a manifest.json that is a FIFO", argv=CONVERT, timeout_s=60,
         setup=lambda t: (packed(t), os.unlink(t / "src.lmdb/manifest.json"), os.mkfifo(t / "src.lmdb/manifest.json"))),
    Case("repack: a damaged progress.json in the staging folder, --resume", argv=[*CONVERT, "--resume"],
         setup=damaged_progress),
    Case("repack: a negative count in progress.json, --resume", argv=["datapipe", "convert", "{tmp}/src.lmdb",
         "{tmp}/out.h5", "--resume"], setup=huge_staged_count),
    Case("repack: class names and paths with terminal escapes, then info", expect="ok",
         code="import subprocess, sys; from pathlib import Path; "
              "[subprocess.run([sys.executable, '-m', 'datapipe', *a], check=True) for a in "
              "(['convert', 'src', 'a.lmdb', '-q'], ['convert', 'a.lmdb', 'b.wds', '-q'], ['info', 'b.wds'])]",
         setup=escaped_classes),
    # a careless user
    Case("repack: into its own folder", argv=["datapipe", "convert", "{tmp}/src.wds", "{tmp}/src.wds/x.lmdb"],
         setup=lambda t: packed(t, ".wds")),
    Case("repack: onto itself with --overwrite", argv=["datapipe", "convert", "{tmp}/src.h5", "{tmp}/src.h5",
         "--overwrite"], setup=lambda t: packed(t, ".h5")),
    Case("repack: with --resize-max", argv=[*CONVERT, "--resize-max", "64"], setup=packed),
    Case("repack: to a suffix that is no format", argv=["datapipe", "convert", "{tmp}/src.lmdb", "{tmp}/out.zip"],
         setup=packed),
    Case("repack: a split it lacks", argv=[*CONVERT, "--split", "test\x1b[31m"], setup=packed),
    Case("repack: works, and info of the copy", expect="ok", setup=packed,
         code="import subprocess, sys; [subprocess.run([sys.executable, '-m', 'datapipe', *a], check=True) for a in "
              "(['convert', 'src.lmdb', 'b.wds', '-q'], ['info', 'b.wds'], ['verify', 'b.wds'])]"),
    Case("doctor: DATA is a FIFO", argv=["datapipe", "doctor", "{tmp}/fifo"], expect="ok", timeout_s=120,
         setup=lambda t: os.mkfifo(t / "fifo")),
    Case("doctor: DATA is /dev/zero", argv=["datapipe", "doctor", "/dev/zero"], expect="ok", timeout_s=120),
    Case("doctor: DATA's name holds terminal escapes", argv=["datapipe", "doctor", "{tmp}/d\x1b[2J\x07"],
         expect="ok", timeout_s=120, setup=lambda t: (t / "d\x1b[2J\x07").mkdir()),
    Case("doctor: DATA is a URL with a password", argv=["datapipe", "doctor",
         "s3://AKIA:CANARYawsSecret0123456789/+abc@bucket/x.wds"], expect="ok", timeout_s=120),
    Case("doctor: a folder holding a FIFO and a link to /dev/zero", argv=["datapipe", "doctor", "{tmp}/d"],
         expect="ok", timeout_s=120,
         setup=lambda t: ((t / "d").mkdir(), os.mkfifo(t / "d/f.jpg"), os.symlink("/dev/zero", t / "d/z.jpg"))),
    Case("info: 100,000 classes of 1,000 characters", expect="ok",
         code="from datapipe.formats.inspect import info_lines; lines = info_lines({'path': 'p', 'format': 'lmdb', "
              "'classes': ['\\x1b[31m' + 'c' * 1000 + str(i) for i in range(100_000)], 'splits': {}}); "
              "print('\\n'.join(lines))"),
    Case("preview: an unknown --recipe", argv=[*PREVIEW, "--recipe", "nope"]),
    Case("preview: --aa with a policy of 10^6 ops", argv=[*PREVIEW, "--aa", "rand-m9-n1000000"], timeout_s=120),
    Case("preview: --aa garbage", argv=[*PREVIEW, "--aa", "rand-\x1b[31m"]),
    Case("preview: --scale nan nan", argv=[*PREVIEW, "--scale", "nan", "nan"]),
    Case("preview: --color-jitter inf", argv=[*PREVIEW, "--color-jitter", "inf"]),
    Case("preview: --aug-repeats 10^9", argv=[*PREVIEW, "--aug-repeats", "1000000000"], timeout_s=120),
    Case("preview: --mixup 1e308 --cutmix -1", argv=[*PREVIEW, "--mixup", "1e308", "--cutmix", "-1"]),
    Case("preview: --aa augmix-m3-w3 renders", argv=[*PREVIEW, "--aa", "augmix-m3-w3"], expect="ok", timeout_s=120),
]


def _fields(**values):
    from datapipe.records import Fields

    return Fields(**values)
