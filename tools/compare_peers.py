"""datapipe beside FFCV (loader) and LitData (converter) on the same folder and cores, one table.

    python tools/compare_peers.py build/webmix --setup          # once: peers' scratch venv
    python tools/compare_peers.py build/webmix [--passes 3] [--json out.json]

--setup installs FFCV's system libraries (apt-get) and builds a scratch venv (--peers-venv,
default build/peers-venv) with the CPU torch, FFCV 1.0.2 (numba, OpenCV) and LitData: users of
datapipe never need them. Every measurement is a fresh process; rows are interleaved (pass 1 runs
every row once, then pass 2...), and the table shows medians and each row's ratio to the anchor.

Loaders (224 px RandomResizedCrop + flip + normalize, batch 64, --workers, random order): images/s
over 2 epochs after a warm-up epoch. FFCV reads a `.beton` written with RGBImageField(write_mode="jpg")
by its idiomatic pipeline; datapipe's `dataloader` backend reads the folder converted to LMDB and to
`.wds` by `datapipe convert` (defaults). Converters: images/s of the call (interpreter and imports
excluded for both) over the whole folder, bad files included: LitData `optimize` stores the raw
bytes and the label; `datapipe convert` validates (the default).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BATCH, SIZE, EPOCHS = 64, 224, 2
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def image_files(folder: Path) -> list[tuple[Path, int]]:
    """(path, label) of every image file under folder/train, classes sorted, bad files included.
    (Not datapipe.scan: this runs in the peers' venv too, where importing datapipe needs h5py.)"""
    classes = sorted(p.name for p in (folder / "train").iterdir() if p.is_dir())
    return [(p, label) for label, c in enumerate(classes)
            for p in sorted((folder / "train" / c).rglob("*")) if p.suffix.lower() in IMAGE_SUFFIXES]


# ---- children: each prints one JSON line --------------------------------------------------------

def timed_epochs(batches, epochs: int = EPOCHS) -> float:
    """images/s over `epochs` epochs after one warm-up epoch; `batches(epoch)` iterates one epoch."""
    for _ in batches(0):
        pass
    started, images = time.perf_counter(), 0
    for epoch in range(1, epochs + 1):
        for images_batch, *_ in batches(epoch):
            images += len(images_batch)
    return images / (time.perf_counter() - started)


def load_ffcv(beton: str, workers: int) -> float:
    import numpy as np
    from ffcv.fields.basics import IntDecoder
    from ffcv.fields.decoders import RandomResizedCropRGBImageDecoder
    from ffcv.loader import Loader, OrderOption
    from ffcv.transforms import NormalizeImage, RandomHorizontalFlip, ToTensor, ToTorchImage

    mean, std = np.array(MEAN) * 255, np.array(STD) * 255
    # NormalizeImage before ToTensor: on the CPU it is numba-compiled, and a compiled stage after the
    # two torch ones makes FFCV 1.0.2's Graph.group_operations loop forever (libffcv/ffcv#396).
    loader = Loader(beton, batch_size=BATCH, num_workers=workers, order=OrderOption.RANDOM, drop_last=False,
                    pipelines={"image": [RandomResizedCropRGBImageDecoder((SIZE, SIZE)), RandomHorizontalFlip(),
                                         NormalizeImage(mean, std, np.float32), ToTensor(), ToTorchImage()],
                               "label": [IntDecoder(), ToTensor()]})
    return timed_epochs(lambda epoch: loader)


def load_datapipe(path: str, workers: int) -> float:
    from datapipe import make_loader

    loader = make_loader(path, backend="dataloader", batch_size=BATCH, image_size=SIZE, num_workers=workers)

    def epoch_batches(epoch: int):
        loader.set_epoch(epoch)
        return loader

    return timed_epochs(epoch_batches)


def convert_litdata(folder: str, workers: int) -> float:
    from litdata import optimize

    files = [(str(p), label) for p, label in image_files(Path(folder))]
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        optimize(fn=_litdata_sample, inputs=files, output_dir=str(Path(tmp) / "out"), chunk_bytes="64MB",
                 num_workers=workers, mode="overwrite")
        elapsed = time.perf_counter() - started
    return len(files) / elapsed


def _litdata_sample(item: tuple[str, int]) -> dict:
    path, label = item
    return {"image": Path(path).read_bytes(), "label": label}


def convert_datapipe(folder: str, workers: int, suffix: str = ".wds") -> float:
    from converters import ConvertOptions, convert

    files = image_files(Path(folder))
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        convert(Path(folder), Path(tmp) / f"out{suffix}", ConvertOptions(workers=workers, progress=False))
        elapsed = time.perf_counter() - started
    return len(files) / elapsed


def convert_datapipe_ray(folder: str, workers: int) -> float:
    """`convert --engine ray` on a local Ray started before the clock (as a cluster that exists)."""
    import ray

    from converters import ConvertOptions, convert

    ray.init(num_cpus=workers, include_dashboard=False, _node_ip_address="127.0.0.1", logging_level="WARNING")
    files = image_files(Path(folder))
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        convert(Path(folder), Path(tmp) / "out.wds", ConvertOptions(engine="ray", progress=False))
        elapsed = time.perf_counter() - started
    ray.shutdown()
    return len(files) / elapsed


def write_beton(folder: str, beton: str, workers: int) -> None:
    """FFCV's writer over the good images only (it hangs on the bad ones, see issue #12)."""
    import numpy as np
    from ffcv.fields import IntField, RGBImageField
    from ffcv.writer import DatasetWriter
    from PIL import Image

    class Images:
        def __init__(self, files):
            self.files = files

        def __len__(self):
            return len(self.files)

        def __getitem__(self, i):
            path, label = self.files[i]
            return np.asarray(Image.open(path).convert("RGB")), label

    good = []
    for path, label in image_files(Path(folder)):
        try:
            with Image.open(path) as img:
                if img.width * img.height <= Image.MAX_IMAGE_PIXELS:
                    img.convert("RGB").load()
                    good.append((path, label))
        except Exception:  # noqa: BLE001 - a bad file: FFCV's writer cannot take it
            pass
    DatasetWriter(beton, {"image": RGBImageField(write_mode="jpg"), "label": IntField()},
                  num_workers=workers).from_indexed_dataset(Images(good))


CHILDREN = {"load_ffcv": load_ffcv, "load_datapipe": load_datapipe, "convert_litdata": convert_litdata,
            "convert_datapipe": convert_datapipe, "convert_datapipe_ray": convert_datapipe_ray}


# ---- driver -------------------------------------------------------------------------------------

def setup(venv: Path) -> None:
    subprocess.run(["apt-get", "install", "-y", "-q", "libturbojpeg0-dev", "libopencv-dev", "pkg-config"], check=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "pip"), "install", "-q"]
    subprocess.run(pip + ["torch==2.13.0"], check=True)  # the CPU build first: ffcv would pull CUDA torch
    subprocess.run(pip + ["numpy", "numba", "opencv-python-headless", "pillow", "litdata==0.2.76"], check=True)
    subprocess.run(pip + ["--no-build-isolation", "ffcv==1.0.2"], check=True)


def run_child(python: str, name: str, *args: str) -> float:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([python, __file__, "--child", name, *args], env=env, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"{name} {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.splitlines()[-1])


def prepare(folder: Path, work: Path, peers: str, workers: int) -> dict[str, Path]:
    """The loaders' inputs, built once (not timed): a .beton, an LMDB and a .wds of the folder."""
    work.mkdir(parents=True, exist_ok=True)
    out = {"beton": work / "webmix.beton", "lmdb": work / "webmix.lmdb", "wds": work / "webmix.wds"}
    if not out["beton"].exists():
        subprocess.run([peers, __file__, "--child", "write_beton", str(folder), str(out["beton"]), str(workers)],
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True)
    for kind in ("lmdb", "wds"):
        if not out[kind].exists():
            subprocess.run([sys.executable, "-m", "datapipe", "convert", str(folder), str(out[kind])], check=True)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path, nargs="?")
    parser.add_argument("--setup", action="store_true", help="install FFCV and LitData in --peers-venv")
    parser.add_argument("--peers-venv", type=Path, default=ROOT / "build" / "peers-venv")
    parser.add_argument("--work", type=Path, default=ROOT / "build" / "peers")
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--only", choices=("load", "convert"), help="measure one table only")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        name, *rest = args.child
        if name == "write_beton":
            write_beton(rest[0], rest[1], int(rest[2]))
            return 0
        print(json.dumps(CHILDREN[name](rest[0], int(rest[1]))))
        return 0
    if args.setup:
        setup(args.peers_venv)
        return 0
    if args.folder is None:
        parser.error("give the image folder to compare on")
    peers = str(args.peers_venv / "bin" / "python")
    if not Path(peers).exists():
        sys.exit(f"no peers venv at {args.peers_venv}: run with --setup first")
    inputs = prepare(args.folder, args.work, peers, args.workers)
    w = str(args.workers)
    rows = {}
    if args.only in (None, "load"):
        rows.update({"load: FFCV .beton (anchor)": (peers, "load_ffcv", str(inputs["beton"])),
                     "load: datapipe dataloader, LMDB": (sys.executable, "load_datapipe", str(inputs["lmdb"])),
                     "load: datapipe dataloader, .wds": (sys.executable, "load_datapipe", str(inputs["wds"]))})
    if args.only in (None, "convert"):
        rows.update({"convert: LitData optimize (anchor)": (peers, "convert_litdata", str(args.folder)),
                     "convert: datapipe convert .wds": (sys.executable, "convert_datapipe", str(args.folder)),
                     "convert: datapipe convert .wds --engine ray": (sys.executable, "convert_datapipe_ray",
                                                                     str(args.folder))})
    results: dict[str, list[float]] = {row: [] for row in rows}
    for n in range(args.passes):
        for row, (python, child, data) in rows.items():
            results[row].append(run_child(python, child, data, w))
            print(f"pass {n + 1}: {row}: {results[row][-1]:.0f} img/s", file=sys.stderr, flush=True)
    print_table(results)
    if args.json:
        args.json.write_text(json.dumps({"workers": args.workers, "passes": args.passes, "runs": results}, indent=1))
    return 0


def print_table(results: dict[str, list[float]]) -> None:
    anchor = 0.0
    print(f"| {'row':<40} | median img/s | vs anchor | runs |")
    print(f"|{'-' * 42}|--------------|-----------|------|")
    for row, runs in results.items():
        median = statistics.median(runs)
        if "(anchor)" in row:
            anchor = median
        print(f"| {row:<40} | {median:12,.0f} | {median / anchor:8.2f}x | {', '.join(f'{r:.0f}' for r in runs)} |")


if __name__ == "__main__":
    raise SystemExit(main())
