"""`datapipe convert imagenet/ out.lmdb` from ImageNet as it is downloaded, without extracting it.

`imagenet/` holds the archives (Kaggle's folders work too):
- `ILSVRC2012_img_train.tar`: a tar of 1,000 per-class tars `WNID.tar`, each of `WNID_N.JPEG` files;
- `ILSVRC2012_img_val.tar`: 50,000 flat `ILSVRC2012_val_NNNNNNNN.JPEG`, labelled by the devkit
  `ILSVRC2012_devkit_t12.tar.gz` (or its extracted folder) or by Kaggle's `LOC_val_solution.csv`;
- Kaggle: `ILSVRC/Data/CLS-LOC/train/WNID/*.JPEG`, and `ILSVRC/Data/CLS-LOC/val/*.JPEG` labelled as above.

The tars are indexed from their headers (datapipe.formats.tar.walk_tar, which trusts nothing it
reads; an inner tar is walked as a byte range of the outer file), and each image becomes a task
whose path is an archive member (converters.members): workers read its bytes with pread. The task
list equals the one of the folder torchvision's ImageNet extracts (`train/WNID/*`, `val/WNID/*`): the train
split's sorted WNIDs as classes for both splits, the same keys, order, labels and bytes, so the same
record digests. A folder that holds `train/` or `val/` folders beside the archives converts as before.
"""
from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from datapipe.formats.tar import walk_tar
from datapipe.records import ClassIndex
from datapipe.formats.scan import (DiskTree, FolderLayout, ImageFile, detect_layout, is_image_name, make_key, scan_folder,
                           walk_relpaths)

from .imagenet_labels import ValLabels, devkit_labels, solution_labels
from .members import ArchiveMember

log = logging.getLogger(__name__)
TRAIN_TAR, VAL_TAR = "ILSVRC2012_img_train.tar", "ILSVRC2012_img_val.tar"
DEVKIT, DEVKIT_FOLDER, SOLUTION = "ILSVRC2012_devkit_t12.tar.gz", "ILSVRC2012_devkit_t12", "LOC_val_solution.csv"
KAGGLE = "ILSVRC/Data/CLS-LOC"
INDEX_THREADS = 8  # inner tars walked at once: header reads are small and scattered (1.28M of them)
Entry = tuple[str, str, str, Any, "int | None"]  # (WNID, name for the key, relpath, path, size)


@dataclass(frozen=True)
class Download:
    """What an ImageNet download folder holds: each split's source (a tar or Kaggle's folder) and
    the validation labels' source."""

    root: Path
    train: Path | None
    val: Path | None
    devkit: Path | None
    solution: Path | None

    def describe(self) -> str:
        labels = self.devkit or self.solution
        parts = [f"train from {self.train.relative_to(self.root)}" if self.train else "",
                 f"val from {self.val.relative_to(self.root)}" + (f" labelled by {labels.name}" if labels else "")
                 if self.val else ""]
        return ", ".join(p for p in parts if p)


def find_download(root: Path) -> Download | None:
    """The ImageNet download in `root`, or None when there is none (or `root` has split folders)."""
    if not root.is_dir() or detect_layout(root) == "splits":
        return None

    def tar_or_folder(split: str) -> Path | None:
        tar, folder = root / (TRAIN_TAR if split == "train" else VAL_TAR), root / KAGGLE / split
        return tar if tar.is_file() else folder if folder.is_dir() else None

    train, val = tar_or_folder("train"), tar_or_folder("val")
    if train is None and val is None:
        return None
    devkit = next((p for p in (root / DEVKIT, root / DEVKIT_FOLDER) if p.exists()), None)
    return Download(root, train, val, devkit, (root / SOLUTION) if (root / SOLUTION).is_file() else None)


def _class_tars(tar: Path) -> dict[str, tuple[str, int, int]]:
    """WNID -> (member name, data offset, size) of each per-class tar in the train tar."""
    members, refused = walk_tar(str(tar))
    for reason in refused:
        log.warning("%s: skipped a member at %s", tar.name, reason)
    out = {}
    for name, offset, size in members:
        base = name.rsplit("/", 1)[-1]
        if not base.endswith(".tar"):
            log.warning("%s: %s is not a per-class tar (WNID.tar); skipped", tar.name, name)
            continue
        out[base[: -len(".tar")]] = (name, offset, size)
    return out


def _walk_class(tar: Path, inner: str, offset: int, size: int) -> tuple[list[tuple[str, int, int]], list[str]]:
    try:
        return walk_tar(str(tar), span=(offset, offset + size))
    except ValueError as exc:
        raise ValueError(f"{inner} inside {exc}") from None


def _train_tar(tar: Path, root: Path, skipped: list[dict[str, str]]) -> tuple[list[str], list[Entry]]:
    """The classes and images of the train tar, from the outer and each inner tar's headers."""
    started, classes = time.perf_counter(), _class_tars(tar)
    log.info("indexing %d class tars in %s (headers only)", len(classes), tar.name)
    with ThreadPoolExecutor(INDEX_THREADS) as pool:
        walks = list(pool.map(lambda c: _walk_class(tar, *classes[c]), classes))
    entries: list[Entry] = []
    for wnid, (members, refused) in zip(classes, walks):
        inner = classes[wnid][0]
        skipped += [{"path": f"{TRAIN_TAR}:{inner}", "reason": reason} for reason in refused]
        for name, offset, size in members:
            if is_image_name(name):
                relpath = f"{TRAIN_TAR}:{inner}:{name}"
                entries.append((wnid, name, relpath, ArchiveMember(f"{root}/{relpath}", str(tar), offset, size), size))
    log.info("indexed %d images in %d class tars in %.1f s", len(entries), len(classes), time.perf_counter() - started)
    return sorted(classes), entries


def _train_folder(folder: Path, root: Path, skipped: list[dict[str, str]]) -> tuple[list[str], list[ImageFile]]:
    """Kaggle's train folder (WNID/*.JPEG), scanned like any class folder; paths relative to `root`."""
    scanned = scan_folder(folder, layout="classes", split="train")
    prefix = folder.relative_to(root).as_posix() + "/"
    skipped += [{**bad, "path": prefix + bad["path"]} for bad in scanned.skipped["train"]]
    return list(scanned.classes.classes), [replace(f, relpath=prefix + f.relpath) for f in scanned.splits["train"]]


def _val_images(source: Path, root: Path, skipped: list[dict[str, str]]) -> list[tuple[str, str, Any, int | None]]:
    """(name, relpath, path, size) of each image of the val tar or of Kaggle's val folder; members
    the tar walk refuses (unsafe names) go to `skipped`."""
    if source.is_dir():
        prefix = source.relative_to(root).as_posix()
        names = [f"{sub}/{name}" if sub else name for sub, name in walk_relpaths(source)]
        return [(name, f"{prefix}/{name}", source / name, None) for name in names]
    members, refused = walk_tar(str(source))
    skipped += [{"path": VAL_TAR, "reason": reason} for reason in refused]
    return [(name, f"{VAL_TAR}:{name}", ArchiveMember(f"{root}/{VAL_TAR}:{name}", str(source), offset, size), size)
            for name, offset, size in members if is_image_name(name)]


def _val_labels(download: Download) -> ValLabels:
    if download.devkit is not None:
        return devkit_labels(download.devkit)
    if download.solution is not None:
        return solution_labels(download.solution)
    alone = ", or convert the train split alone with --split train" if download.train else ""
    raise ValueError(f"{download.val} has no labels: put {DEVKIT} (its data/ILSVRC2012_validation_ground_truth.txt "
                     f"and data/meta.mat) or Kaggle's {SOLUTION} in {download.root}{alone}")


def _val(source: Path, root: Path, labels: ValLabels, classes: ClassIndex,
         skipped: list[dict[str, str]]) -> list[Entry]:
    """The labelled val images of `source` (the val tar or folder); the others go to `skipped`."""
    images = _val_images(source, root, skipped)
    labels.check_count(len(images), source.name)
    entries: list[Entry] = []
    for name, relpath, path, size in images:
        wnid = labels.wnid(name)
        if wnid is None:
            skipped.append({"path": relpath, "reason": f"no label in {labels.source}"})
        elif wnid not in classes:
            skipped.append({"path": relpath, "reason": f"class {wnid!r} is not in the train split's class list"})
        else:
            entries.append((wnid, name, relpath, path, size))
    return entries


def _image_files(entries: list[Entry], classes: ClassIndex) -> list[ImageFile]:
    """ImageFolder's order and keys for WNID/name (what extracting the archives would give)."""
    taken: set[str] = set()
    return [ImageFile(path, relpath, classes.label(wnid), make_key(f"{wnid}/{name}", taken), size)
            for wnid, name, relpath, path, size in sorted(entries, key=lambda e: (e[0], e[1]))]


def _wanted(download: Download, split: str | None) -> list[str]:
    present = [s for s in ("train", "val") if getattr(download, s) is not None]
    if split is None:
        return present
    if split not in present:
        raise ValueError(f"--split {split!r}: the ImageNet download in {download.root} has {' and '.join(present)} "
                         f"(pass one of {present}, or no --split for all)")
    return [split]


def _train(download: Download, wanted: list[str],
           skipped: dict[str, list[dict[str, str]]]) -> tuple[list[str] | None, list[ImageFile] | None]:
    """The train split's classes (None: no train split) and, when it is wanted, its images."""
    train = download.train
    if train is None:
        return None, None
    if "train" not in wanted:  # the class list alone: the outer tar's headers, or the folder names
        return (sorted(_class_tars(train)) if train.is_file() else DiskTree().subdirs(train)), None
    if train.is_dir():
        return _train_folder(train, download.root, skipped["train"])
    names, entries = _train_tar(train, download.root, skipped["train"])
    return names, _image_files(entries, ClassIndex(names))


def scan_imagenet(root: str | Path, *, split: str | None = None) -> FolderLayout | None:
    """The ImageNet download in `root` as a scanned folder (None: `root` holds none); `split` keeps
    one split ('train' or 'val'), the classes still the train split's."""
    download = find_download(Path(root))
    if download is None:
        return None
    wanted = _wanted(download, split)
    log.info("%s: ImageNet download: %s", root, download.describe())
    skipped: dict[str, list[dict[str, str]]] = {s: [] for s in wanted}
    labels = _val_labels(download) if "val" in wanted else None
    names, train = _train(download, wanted, skipped)
    classes = ClassIndex(names if names is not None else labels.classes)  # type: ignore[union-attr]
    splits = {"train": train} if train is not None else {}
    if labels is not None and download.val is not None:
        splits["val"] = _image_files(_val(download.val, download.root, labels, classes, skipped["val"]), classes)
    return FolderLayout(download.root, classes, splits, skipped)
