"""Issue #48's `datapipe bench` surfaces: the too-short rule, the exit status when no row has a figure, the
verdicts' words, the pool's CPU column; tried as a careless user (bad values, paths that cannot be written,
data too short, a Ray pool that cannot run) and a hostile dataset author (names with terminal escapes,
records that never decode)."""
from __future__ import annotations

import shutil
from pathlib import Path

from tools.adversarial.harness import FIXTURES, Case

IMAGES = FIXTURES / "imagefolder"
QUICK = ["--batch-size", "8", "--image-size", "32", "--seconds", "5", "--repeats", "1", "--workers", "1"]


def packed(root: Path, name: str = "src.lmdb", source: Path = IMAGES) -> Path:
    from converters import ConvertOptions, convert

    dst = root / name
    convert(source, dst, ConvertOptions(progress=False, workers=1))
    return dst


def escaped_name(root: Path) -> None:
    packed(root, "\x1b[2J\x1b[31mred\x07.lmdb")


def never_decodes(root: Path) -> None:
    """A folder whose every image is a valid header over garbage: scanned as images, decoded by none."""
    for k in range(40):
        folder = root / "bad" / "train" / f"c{k % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{k}.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(64))


def writable_folder_as_json(root: Path) -> None:
    packed(root)
    (root / "out.json").mkdir()


def long_folder(root: Path) -> None:
    """The fixture's clean images, 10 copies each (~260 records): long enough at batch 4, 1 worker."""
    for image in (IMAGES / "train").rglob("*"):
        if image.is_file() and image.suffix.lower() in (".jpg", ".jpeg") and image.stat().st_size > 1000:
            folder = root / "long" / "train" / image.relative_to(IMAGES / "train").parts[0]
            folder.mkdir(parents=True, exist_ok=True)
            for k in range(10):
                shutil.copyfile(image, folder / f"{image.stem}_{k}.jpg")


BENCH = ["datapipe", "bench", "{tmp}/src.lmdb"]
CASES = [
    Case("missing dataset", argv=["datapipe", "bench", "{tmp}/nope.lmdb"]),
    Case("batch size 0", argv=[*BENCH, "--batch-size", "0"], setup=packed),
    Case("seconds nan", argv=[*BENCH, "--seconds", "nan", "--suites", "read"], setup=packed),
    Case("seconds -1", argv=[*BENCH, "--seconds", "-1"], setup=packed),
    Case("repeats 0", argv=[*BENCH, "--repeats", "0"], setup=packed),
    Case("warmup -1", argv=[*BENCH, "--warmup", "-1"], setup=packed),
    Case("workers -1", argv=[*BENCH, "--workers", "-1", "--suites", "pipeline", "--backends", "threads"],
         setup=packed),
    Case("image size 0", argv=[*BENCH, *QUICK, "--image-size", "0", "--suites", "decode"], setup=packed),
    Case("image size 100000", argv=[*BENCH, *QUICK, "--image-size", "100000", "--suites", "decode,pipeline",
                                    "--backends", "threads"], setup=packed, expect="refused", timeout_s=120),
    Case("batch size a billion", argv=[*BENCH, "--batch-size", "1000000000", "--suites", "pipeline",
                                       "--backends", "threads"], setup=packed, timeout_s=120),
    Case("no suites", argv=[*BENCH, "--suites", ","], setup=packed),
    Case("unknown suite", argv=[*BENCH, "--suites", "everything"], setup=packed),
    Case("unknown backend", argv=[*BENCH, "--backends", "turbo"], setup=packed),
    Case("pool size 0", argv=[*BENCH, "--backends", "ray", "--pool-workers", "0"], setup=packed),
    Case("simulate step -5", argv=[*BENCH, "--simulate-step", "-5"], setup=packed),
    Case("too short: every loader row, exit 2 with one line",
         argv=[*BENCH, *QUICK, "--suites", "baseline,pipeline", "--backends", "threads,dataloader"], setup=packed,
         timeout_s=180),
    Case("too short, but read and decode measured: exit 0", argv=[*BENCH, *QUICK, "--suites", "read,decode,pipeline",
                                                                 "--backends", "threads"],
         setup=packed, expect="ok", timeout_s=180),
    Case("json into a folder", argv=[*BENCH, *QUICK, "--suites", "read", "--json", "{tmp}/out.json"],
         setup=writable_folder_as_json, timeout_s=120),
    Case("json under a missing folder", argv=[*BENCH, *QUICK, "--suites", "read", "--json", "{tmp}/no/out.json"],
         setup=packed, timeout_s=120),
    Case("plot as .txt", argv=[*BENCH, *QUICK, "--suites", "read", "--plot", "{tmp}/out.txt"], setup=packed,
         expect="either", timeout_s=120),
    Case("dataset name with terminal escapes", argv=["datapipe", "bench", "{tmp}/\x1b[2J\x1b[31mred\x07.lmdb", *QUICK,
                                                     "--suites", "read"],
         setup=escaped_name, expect="ok", timeout_s=120),
    Case("no record decodes", argv=["datapipe", "bench", "{tmp}/bad", *QUICK, "--suites", "decode,pipeline",
                                    "--backends", "threads"], setup=never_decodes, timeout_s=180),
    Case("long enough: figures, pool column, exit 0",
         argv=["datapipe", "bench", "{tmp}/long", "--batch-size", "4", "--image-size", "32", "--seconds", "120",
               "--repeats", "2", "--warmup", "1", "--workers", "1", "--suites", "decode,baseline,pipeline",
               "--backends", "threads,dataloader", "--json", "{tmp}/b.json"],
         setup=long_folder, expect="ok", timeout_s=400),
    Case("ray pool on resources no node has", argv=[*BENCH, *QUICK, "--suites", "pipeline", "--backends", "ray",
                                                    "--pool-resources", "nosuchthing=1"],
         setup=packed, timeout_s=300, mem_mb=16384),
    Case("ray: RAY_ADDRESS that answers nothing", argv=[*BENCH, *QUICK, "--suites", "pipeline", "--backends", "ray"],
         setup=packed, env={"RAY_ADDRESS": "127.0.0.1:9"}, timeout_s=300, mem_mb=16384),
]
