"""Training recipes' data side: datapipe beside timm's and torchvision's own loaders (issue #32 item 7).

    python tools/peer_recipes.py --setup --recipes-venv /work/peers-venv     # once (large: CUDA wheels)
    python tools/make_imagenet_like.py --out build/imagenet-like              # the ImageNet-sized corpus
    python tools/peer_recipes.py build/imagenet-like --recipes-venv /work/peers-venv --passes 2 --epochs 1 \
        --json benchmarks/peers-recipes-cpu.json
    python tools/peer_recipes.py build/imagenet-like --recipes-venv /work/peers-venv --only "DeiT,deit,224" \
        --datapipe-tree before=/work/wt-bench --datapipe-tree after=.    # two datapipes, interleaved

Rows, each in a fresh process, interleaved and measured as tools/compare_peers.py does (its
run_child/measure: images/s over the timed epochs after a warm-up epoch, CPU-s of the whole process
tree per 1,000 images, peak RSS/PSS), batch 64, `--workers` workers:
- timm (the recipes venv): `timm.data.create_transform(224, is_training=True,
  auto_augment="rand-m9-mstd0.5-inc1", re_prob=0.25, re_mode="pixel", interpolation="bicubic")` in a
  torch DataLoader(shuffle, drop_last as timm's create_loader does for training) over PIL images, then
  `timm.data.Mixup(mixup_alpha=0.8, cutmix_alpha=1.0, switch_prob=0.5, label_smoothing=0.1)` on each
  batch in the main process (timm's train.py without its CUDA prefetcher); and the crop-and-flip row:
  create_transform without auto_augment, erasing or colour jitter (timm turns jitter on by default).
- torchvision (the recipes venv): the references' ClassificationPresetTrain for the ResNet-50 V2
  recipe (transforms.v2, PIL backend: RandomResizedCrop 176 bilinear antialias, flip,
  TrivialAugmentWide, PILToTensor, ToDtype float, Normalize, RandomErasing 0.1, ToPureTensor) in a
  DataLoader whose collate_fn applies RandomChoice([MixUp(0.2), CutMix(1.0)]) as train.py does
  (label smoothing 0.1 lives in the references' loss, not in the data); and its crop-and-flip row.
- datapipe (this venv): make_loader(recipe="deit", 224) and (recipe="tv-v2", 176) on the `threads`
  and `dataloader` backends over the LMDB of the folder, beside crop-and-flip rows with the same
  crop and interpolation (224 bicubic; 176 bilinear).

timm and torchvision live in a venv of their own (torch 2.14.1 + torchvision 0.29.1, timm, Pillow <
13: timm's posterize passes 0 bits at magnitude 10, which Pillow 13 rejects); datapipe never needs
them. The folder rows read the files Pillow decodes (tools/peer_loaders.good_files), datapipe the
records `datapipe convert` accepted.

--datapipe-tree NAME=PATH (repeatable): datapipe's rows once per tree ("datapipe@NAME threads:
recipe=deit"...), each child run with PYTHONPATH=PATH (checked: the child reports the datapipe it
imported), all rows interleaved in each pass; the peers' rows once. Before/after comparisons of two
commits in one machine state. The LMDB is converted by this tree's datapipe.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
import peer_loaders as peers  # noqa: E402  (stdlib only at import: runs in both venvs)

RECIPES_PACKAGES = ("torch==2.14.1", "torchvision==0.29.1", "timm", "pillow<13")
DEIT = {"auto_augment": "rand-m9-mstd0.5-inc1", "re_prob": 0.25, "re_mode": "pixel", "interpolation": "bicubic"}
DEIT_MIX = {"mixup_alpha": 0.8, "cutmix_alpha": 1.0, "switch_prob": 0.5, "label_smoothing": 0.1}
TV_SIZE = 176


# ---- the rows (children) ------------------------------------------------------------------------

class PILFolder:
    """(path, label) list -> (transform(PIL RGB image), label), as timm's ImageDataset and
    torchvision's ImageFolder load a file (PIL, convert("RGB"))."""

    def __init__(self, files_json: str, transform) -> None:
        self.files, self.transform = json.loads(Path(files_json).read_text()), transform

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int):
        from PIL import Image

        path, label = self.files[index]
        with Image.open(path) as img:
            return self.transform(img.convert("RGB")), label


def classes(files_json: str) -> int:
    return 1 + max(label for _, label in json.loads(Path(files_json).read_text()))


def load_timm(files_json: str, workers: int, epochs: int, recipe: bool) -> dict:
    """timm's create_transform in a DataLoader; with the recipe, timm's Mixup on each batch."""
    import torch
    from timm.data import Mixup, create_transform

    if recipe:
        transform = create_transform(peers.SIZE, is_training=True, **DEIT)
    else:
        transform = create_transform(peers.SIZE, is_training=True, interpolation="bicubic", color_jitter=None)
    loader = torch.utils.data.DataLoader(PILFolder(files_json, transform), batch_size=peers.BATCH, shuffle=True,
                                         num_workers=workers, drop_last=True)  # Mixup needs an even batch
    mix = Mixup(**DEIT_MIX, num_classes=classes(files_json)) if recipe else None
    return peers.timed_epochs(lambda epoch: (mix(*batch) for batch in loader) if mix else loader, epochs)


def tv_preset(recipe: bool):
    """torchvision references' ClassificationPresetTrain(use_v2=True, backend="pil") for the
    ResNet-50 V2 recipe (crop 176, ta_wide, random_erase 0.1), or without the augmentations."""
    import torch
    from torchvision.transforms import v2 as T

    steps = [T.RandomResizedCrop(TV_SIZE, interpolation=T.InterpolationMode.BILINEAR, antialias=True),
             T.RandomHorizontalFlip(0.5)]
    if recipe:
        steps.append(T.TrivialAugmentWide(interpolation=T.InterpolationMode.BILINEAR))
    steps += [T.PILToTensor(), T.ToDtype(torch.float, scale=True), T.Normalize(mean=peers.MEAN, std=peers.STD)]
    if recipe:
        steps.append(T.RandomErasing(p=0.1))
    return T.Compose([*steps, T.ToPureTensor()])


class MixCollate:
    """torchvision references' collate_fn: default_collate, then RandomChoice([MixUp, CutMix])."""

    def __init__(self, num_classes: int) -> None:
        from torchvision.transforms import v2 as T

        self.mix = T.RandomChoice([T.MixUp(alpha=0.2, num_classes=num_classes),
                                   T.CutMix(alpha=1.0, num_classes=num_classes)])

    def __call__(self, batch):
        from torch.utils.data import default_collate

        return self.mix(*default_collate(batch))


def load_torchvision(files_json: str, workers: int, epochs: int, recipe: bool) -> dict:
    import torch

    collate = MixCollate(classes(files_json)) if recipe else None
    loader = torch.utils.data.DataLoader(PILFolder(files_json, tv_preset(recipe)), batch_size=peers.BATCH,
                                         shuffle=True, num_workers=workers, collate_fn=collate)
    return peers.timed_epochs(lambda epoch: loader, epochs)


def load_datapipe(path: str, workers: int, epochs: int, backend: str, size: int, **recipe) -> dict:
    """make_loader with a preset (recipe="deit") or Recipe fields (interpolation="bicubic")."""
    import datapipe
    from datapipe import make_loader

    loader = make_loader(path, backend=backend, batch_size=peers.BATCH, image_size=size, num_workers=workers,
                         **recipe)

    def epoch_batches(epoch: int):
        loader.set_epoch(epoch)
        return loader

    return {**peers.timed_epochs(epoch_batches, epochs), "datapipe_file": datapipe.__file__}


CHILDREN = {"timm_deit": functools.partial(load_timm, recipe=True),
            "timm_plain": functools.partial(load_timm, recipe=False),
            "tv_v2": functools.partial(load_torchvision, recipe=True),
            "tv_plain": functools.partial(load_torchvision, recipe=False)}
for _backend in ("threads", "dataloader"):
    CHILDREN.update({
        f"{_backend}_deit": functools.partial(load_datapipe, backend=_backend, size=224, recipe="deit"),
        f"{_backend}_plain224": functools.partial(load_datapipe, backend=_backend, size=224, interpolation="bicubic"),
        f"{_backend}_tvv2": functools.partial(load_datapipe, backend=_backend, size=TV_SIZE, recipe="tv-v2"),
        f"{_backend}_plain176": functools.partial(load_datapipe, backend=_backend, size=TV_SIZE)})


# ---- driver -------------------------------------------------------------------------------------

# row -> (venv: "recipes" | "datapipe", child, input: "good" | "lmdb", the recipe's anchor row, the
# same loader's crop-and-flip row); an anchor or crop-and-flip of None: the row is one itself.
TIMM, TV = "timm: DeiT recipe (anchor)", "torchvision: V2 preset 176 (anchor)"
ROWS = {
    TIMM: ("recipes", "timm_deit", "good", None, "timm: crop+flip 224 bicubic"),
    "timm: crop+flip 224 bicubic": ("recipes", "timm_plain", "good", None, None),
    "datapipe threads: recipe=deit": ("datapipe", "threads_deit", "lmdb", TIMM,
                                      "datapipe threads: crop+flip 224 bicubic"),
    "datapipe threads: crop+flip 224 bicubic": ("datapipe", "threads_plain224", "lmdb", None, None),
    "datapipe dataloader: recipe=deit": ("datapipe", "dataloader_deit", "lmdb", TIMM,
                                         "datapipe dataloader: crop+flip 224 bicubic"),
    "datapipe dataloader: crop+flip 224 bicubic": ("datapipe", "dataloader_plain224", "lmdb", None, None),
    TV: ("recipes", "tv_v2", "good", None, "torchvision: crop+flip 176 bilinear"),
    "torchvision: crop+flip 176 bilinear": ("recipes", "tv_plain", "good", None, None),
    "datapipe threads: recipe=tv-v2 176": ("datapipe", "threads_tvv2", "lmdb", TV,
                                           "datapipe threads: crop+flip 176 bilinear"),
    "datapipe threads: crop+flip 176 bilinear": ("datapipe", "threads_plain176", "lmdb", None, None),
    "datapipe dataloader: recipe=tv-v2 176": ("datapipe", "dataloader_tvv2", "lmdb", TV,
                                              "datapipe dataloader: crop+flip 176 bilinear"),
    "datapipe dataloader: crop+flip 176 bilinear": ("datapipe", "dataloader_plain176", "lmdb", None, None),
}


def setup(venv: Path) -> None:
    """A venv with timm and torchvision (torch pinned by a constraints file), checked to import on the CPU."""
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pin = venv / "recipes-constraint.txt"
    pin.write_text("".join(f"{p}\n" for p in RECIPES_PACKAGES if p != "timm"))
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "-c", str(pin), *RECIPES_PACKAGES], check=True)
    print(subprocess.run([str(venv / "bin" / "python"), "-c", VERSIONS], capture_output=True, text=True,
                         check=True).stdout.strip())


VERSIONS = ("import PIL, timm, torch, torchvision; print(f'torch {torch.__version__}, torchvision "
            "{torchvision.__version__}, timm {timm.__version__}, Pillow {PIL.__version__}')")


def tree_row(row: str, tree: str) -> str:
    """A datapipe row's name for one of --datapipe-tree's trees: "datapipe@NAME threads: ..."."""
    return row.replace("datapipe ", f"datapipe@{tree} ", 1)


def with_trees(trees: dict[str, Path]) -> None:
    """ROWS with each datapipe row once per tree (its anchor and crop-and-flip row the same tree's)."""
    rows = {}
    for row, (venv, child, kind, anchor, plain) in ROWS.items():
        if venv != "datapipe":
            rows[row] = (venv, child, kind, anchor, plain)
            continue
        for tree in trees:
            rows[tree_row(row, tree)] = (venv, child, kind, anchor, plain and tree_row(plain, tree))
    ROWS.clear()
    ROWS.update(rows)


def recipe_rows(folder: Path, work: Path, recipes_python: str,
                trees: dict[str, Path] | None = None) -> dict[str, tuple]:
    """row -> (python, child, input[, PYTHONPATH]); the inputs built once (not timed): good files and
    an LMDB. With `trees` (name -> datapipe tree), datapipe's rows once per tree."""
    work.mkdir(parents=True, exist_ok=True)
    good, lmdb = work / f"{folder.name}.good.json", work / f"{folder.name}.lmdb"
    if not good.exists():
        good.write_text(json.dumps(peers.good_files(folder)))
    if not lmdb.exists():
        subprocess.run([sys.executable, "-m", "datapipe", "convert", str(folder), str(lmdb)], check=True)
    python = {"recipes": recipes_python, "datapipe": sys.executable}
    data = {"good": str(good), "lmdb": str(lmdb)}
    if trees:
        with_trees(trees)
    out = {}
    for row, (venv, child, kind, _, _) in ROWS.items():
        out[row] = (python[venv], child, data[kind])
        if trees and venv == "datapipe":
            out[row] += (str(trees[row.split("@", 1)[1].split(" ", 1)[0]]),)
    return out


def summarize(results: dict[str, list[dict]]) -> dict[str, dict]:
    """Medians per row, the per-pass ratio of each recipe row to its anchor (timm's DeiT row or
    torchvision's V2 row, same pass) and the recipe's cost: CPU-s/1k over the same loader's
    crop-and-flip row, and its images/s ratio, per pass and their median."""
    def med(row: str, key: str) -> float:
        return statistics.median(r[key] for r in results[row])

    def per_pass(row: str, other: str, key: str) -> list[float]:
        return [a[key] / b[key] for a, b in zip(results[row], results[other])]

    out = {}
    for row in results:
        _, _, _, anchor, plain = ROWS[row]
        entry = {"images_per_s": med(row, "images_per_s"), "cpu_s_per_1k": med(row, "cpu_s_per_1k"),
                 "peak_rss_mb": med(row, "peak_rss_mb"), "peak_pss_mb": med(row, "peak_pss_mb"),
                 "runs_images_per_s": [r["images_per_s"] for r in results[row]],
                 "runs_cpu_s_per_1k": [r["cpu_s_per_1k"] for r in results[row]]}
        if anchor in results:
            rate = per_pass(row, anchor, "images_per_s")
            entry.update({"anchor": anchor, "x_anchor_images_per_s": statistics.median(rate), "x_anchor_runs": rate,
                          "x_anchor_cpu": statistics.median(per_pass(row, anchor, "cpu_s_per_1k"))})
        if plain in results:
            cost = per_pass(row, plain, "cpu_s_per_1k")
            entry.update({"crop_flip_row": plain, "recipe_cpu_x": statistics.median(cost), "recipe_cpu_x_runs": cost,
                          "recipe_cpu_ms_per_image_added": med(row, "cpu_s_per_1k") - med(plain, "cpu_s_per_1k"),
                          "recipe_images_per_s_x": statistics.median(per_pass(row, plain, "images_per_s"))})
        out[row] = entry
    return out


def print_table(summary: dict[str, dict]) -> None:
    print("| row | img/s | CPU-s/1k img | x anchor img/s (same pass) | x anchor CPU | recipe CPU x crop+flip "
          "| recipe +CPU-ms/img | peak RSS MB | runs img/s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row, m in summary.items():
        ratio = f"{m['x_anchor_images_per_s']:.2f}" if "anchor" in m else "1.00" if row in (TIMM, TV) else ""
        cpu = f"{m['x_anchor_cpu']:.2f}" if "anchor" in m else "1.00" if row in (TIMM, TV) else ""
        cost = f"{m['recipe_cpu_x']:.2f}" if "recipe_cpu_x" in m else ""
        added = f"{m['recipe_cpu_ms_per_image_added']:+.2f}" if "recipe_cpu_x" in m else ""
        runs = ", ".join(f"{r:.0f}" for r in m["runs_images_per_s"])
        print(f"| {row} | {m['images_per_s']:,.0f} | {m['cpu_s_per_1k']:.2f} | {ratio} | {cpu} | {cost} | {added} "
              f"| {m['peak_rss_mb']:,.0f} | {runs} |")


def load_average() -> list[float]:
    return list(os.getloadavg())


def datapipe_tree(root: Path = ROOT) -> dict:
    """The commit datapipe's rows ran and the files changed since (a shared work tree moves)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True).stdout.strip()

    return {"commit": git("rev-parse", "HEAD"),
            "changed": git("status", "--short", "--untracked-files=no").splitlines()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path, nargs="?", help="image folder (ImageNet layout)")
    parser.add_argument("--setup", action="store_true", help="build --recipes-venv with timm and torchvision")
    parser.add_argument("--recipes-venv", type=Path, default=ROOT / "build" / "recipes-venv")
    parser.add_argument("--work", type=Path, default=ROOT / "build" / "peers")
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=1, help="timed epochs per run (after a warm-up one)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--only", help="comma-separated substrings: measure the rows whose names hold one")
    parser.add_argument("--datapipe-tree", action="append", default=[], metavar="NAME=PATH",
                        help="run datapipe's rows once per tree (PYTHONPATH=PATH), labelled datapipe@NAME")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        name, data, workers, epochs = args.child
        print(json.dumps(CHILDREN[name](data, int(workers), int(epochs))))
        return 0
    if args.setup:
        setup(args.recipes_venv)
        return 0
    if not args.folder:
        parser.error("give the image folder to compare on")
    recipes_python = str(args.recipes_venv / "bin" / "python")
    if not Path(recipes_python).exists():
        sys.exit(f"no recipes venv at {args.recipes_venv}: run with --setup first")
    import compare_peers  # the driver's meters (imports numpy: this venv only)

    versions = subprocess.run([recipes_python, "-c", VERSIONS], capture_output=True, text=True, check=True).stdout
    trees = {}
    for spec in args.datapipe_tree:
        name, sep, path = spec.partition("=")
        if not sep or not name or " " in name or "@" in name:
            parser.error(f"--datapipe-tree {spec!r}: give NAME=PATH")
        trees[name] = Path(path).resolve()
    rows = recipe_rows(args.folder, args.work, recipes_python, trees)
    if args.only:
        rows = {row: how for row, how in rows.items() if any(part in row for part in args.only.split(","))}
    before = load_average()
    results = compare_peers.measure(rows, args.passes, args.workers, args.epochs, script=__file__)
    after = load_average()
    for row, runs in results.items():  # each datapipe child imported the tree it was meant to
        for run in runs:
            if "datapipe_file" in run and len(rows[row]) > 3 and not run["datapipe_file"].startswith(rows[row][3] + "/"):
                sys.exit(f"{row}: the child imported {run['datapipe_file']}, not {rows[row][3]}'s datapipe")
    summary = summarize(results)
    print(f"\n{args.folder} ({args.workers} workers, {args.passes} passes, {args.epochs} timed epochs); "
          f"{versions.strip()}; load average before {before}, after {after}")
    print_table(summary)
    if args.json:
        args.json.write_text(json.dumps({"workers": args.workers, "passes": args.passes, "epochs": args.epochs,
                                         "batch_size": peers.BATCH, "machine": compare_peers.machine_description(),
                                         "peers": versions.strip(), "datapipe": datapipe_tree(),
                                         "datapipe_trees": {name: {"path": str(path), **datapipe_tree(path)}
                                                            for name, path in trees.items()},
                                         "load_average_before": before,
                                         "load_average_after": after, "summary": summary, "runs": results},
                                        indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
