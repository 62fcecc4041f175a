"""Find the splits, classes and image files of an image folder (ImageNet layout or flat + labels CSV).

Used by the plain-folder reader and by the converters, so both see the same files, labels and keys.
The folder may also be an object-store prefix (`s3://bucket/raw/`): its object names are read as a
folder tree, so a store and a disk holding the same files scan to the same task list.
"""
from __future__ import annotations

import csv
import functools
import hashlib
import logging
import os
import re
from collections import defaultdict
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Iterator

from ..records import NO_FIELDS, ClassIndex, Fields
from ..storage.dataset_files import SIDECAR_MAX_BYTES, BadDatasetFile, read_dataset_file, too_big
from ..storage.urls import is_url
from . import field_text

log = logging.getLogger(__name__)
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm")
SPLIT_NAMES = ("train", "training", "val", "valid", "validation", "test", "testing")
LAYOUTS = ("auto", "classes", "splits")
_KEY_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")
_KEY_MAX = 80
SIDECARS = {".txt": "text", ".json": "meta"}  # NAME.txt (caption), NAME.json (metadata) beside NAME.jpg


@dataclass(frozen=True)
class ImageFile:
    """One input image: where it is, its path relative to the scanned root, its label and key."""

    path: Path
    relpath: str
    label: int
    key: str
    size: int | None = None  # known from a store's listing; None: stat the file
    fields: Fields = NO_FIELDS  # caption, JSON metadata, multi-labels found beside it (records.Fields)


@dataclass(frozen=True)
class FolderLayout:
    """A scanned folder: the class list (train split's) and each split's files in ImageFolder order."""

    root: Path
    classes: ClassIndex
    splits: dict[str, list[ImageFile]]
    skipped: dict[str, list[dict[str, str]]]


def printable(relpath: str) -> str:
    """A file name as valid UTF-8 text: bytes that are not UTF-8 (which os.walk hands back as lone
    surrogates, and which JSON and digests cannot encode) are written as \\xNN escapes."""
    return relpath.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def is_image_name(name: str) -> bool:
    return name.lower().endswith(IMAGE_EXTENSIONS)


def make_key(relpath: str, taken: set[str]) -> str:
    """An ASCII key without dots or slashes, unique within `taken`, derived from the relative path."""
    stem = relpath.rsplit(".", 1)[0] if "." in relpath.rsplit("/", 1)[-1] else relpath
    key = _KEY_UNSAFE.sub("_", stem).strip("_") or "img"
    if len(key) > _KEY_MAX:
        key = f"{key[:_KEY_MAX - 13]}_{hashlib.sha1(relpath.encode()).hexdigest()[:12]}"
    unique, n = key, 1
    while unique in taken:
        n += 1
        unique = f"{key}_{n}"
    taken.add(unique)
    return unique


KEY_MAX_STORED = 95  # a .wds member is KEY.EXT in USTAR's 100-byte name field (".json": 5)
_KEY_STORED = re.compile(rf"[A-Za-z0-9_-]{{1,{KEY_MAX_STORED}}}")


def check_key(key: object, where: str) -> str:
    """`key` if it is a key make_key could give (ASCII letters, digits, '_' and '-'; at most
    KEY_MAX_STORED characters), else a ValueError naming `where`: a record's key becomes file names
    in .wds shards, and one from another dataset may have been crafted."""
    if isinstance(key, str) and _KEY_STORED.fullmatch(key):
        return key
    shown = repr(key)[:60] + ("..." if len(repr(key)) > 60 else "")
    raise ValueError(f"{where}: key {shown} is not a record key (ASCII letters, digits, '_' and '-', at most "
                     f"{KEY_MAX_STORED} characters); the dataset is damaged or was crafted")


def walk_relpaths(folder: str | Path, unreadable: list[str] | None = None,
                  sidecars: set[str] | None = None, dangling: dict[str, None] | None = None) -> list[tuple[str, str]]:
    """(subfolder relative to `folder`, file name) of the image files under `folder` in ImageFolder's
    order, following symlinks without looping: two strings a file, no Path objects (1.28M files).
    Folders that cannot be listed are added to `unreadable` (their files would vanish unseen), symlinks
    to nothing named like a folder (no image or sidecar extension) to `dangling`; the kinds of sidecar
    found beside an image ("text", "meta") to `sidecars`."""
    found: list[tuple[str, str]] = []
    seen: set[str] = set()
    folder = os.fspath(folder)
    onerror = None if unreadable is None else (lambda exc: unreadable.append(exc.filename))
    for root, dirs, files in os.walk(folder, followlinks=True, onerror=onerror):
        real = os.path.realpath(root)
        if real in seen:
            dirs[:] = []
            continue
        seen.add(real)
        dirs.sort()
        sub = os.path.relpath(root, folder)
        sub = "" if sub == "." else sub
        found.extend((sub, f) for f in sorted(files) if is_image_name(f))
        if dangling is not None:  # os.walk lists a link to a folder that is gone among the files
            for f in files:
                path = os.path.join(root, f)
                if not f.lower().endswith((*IMAGE_EXTENSIONS, ".txt", ".json")) and os.path.islink(path) and \
                        not os.path.exists(path):
                    dangling[path] = None
        if sidecars is not None:
            sidecars |= sidecar_kinds(files)
    found.sort()
    return found


def walk_images(folder: Path, unreadable: list[str] | None = None, sidecars: set[str] | None = None,
                dangling: dict[str, None] | None = None) -> list[Path]:
    """Image files under `folder` in ImageFolder's order, following symlinks without looping."""
    return [Path(folder, sub, name) for sub, name in walk_relpaths(folder, unreadable, sidecars, dangling)]


def sidecar_kinds(names: Collection[str]) -> set[str]:
    """The kinds of sidecar ("text", "meta") among one folder's file `names` that lie beside an image
    of the same stem (`notes.txt` alone is no caption)."""
    side = [os.path.splitext(n) for n in names if n.endswith((".txt", ".json"))]
    if not side:
        return set()
    stems = {os.path.splitext(n)[0] for n in names if is_image_name(n)}
    return {SIDECARS[ext] for stem, ext in side if stem in stems}


def read_optional(path: str, root: str | None = None) -> bytes | None:
    """A sidecar's bytes, or None when there is no such file; read the one safe way
    (dataset_files: no link out of `root` or the image's folder, regular files only, at most
    SIDECAR_MAX_BYTES), else BadDatasetFile."""
    return read_dataset_file(path, limit=SIDECAR_MAX_BYTES, what="sidecar", root=root)


def sidecar_reader(root: str | Path) -> Callable[[str], bytes | None]:
    """read_optional for the sidecars of the dataset at `root` (links inside it are followed)."""
    return functools.partial(read_optional, root=os.fspath(root))


def read_sidecars(image: str, where: str, kinds: Collection[str],
                  read: Callable[[str], bytes | None] = read_optional) -> Fields:
    """The caption and metadata beside `image` (NAME.txt, NAME.json; only the `kinds` a scan found
    in its folder are looked for), read by `read`; a ValueError names a bad one by `where`, the
    image's relative path with the sidecar's extension."""
    stem, shown = os.path.splitext(image)[0], os.path.splitext(where)[0]
    values: dict[str, str] = {}
    for ext, kind in SIDECARS.items():
        if kind not in kinds:
            continue
        label = "caption" if kind == "text" else "metadata"
        try:
            raw = read(stem + ext)
        except BadDatasetFile as exc:
            raise ValueError(f"{label} {shown}{ext} {exc.reason}") from None
        except OSError as exc:
            raise ValueError(f"{shown}{ext} cannot be read ({getattr(exc, 'strerror', None) or exc})") from None
        if raw is not None:
            values[kind] = (field_text.caption(raw, f"{label} {shown}{ext}", strip_newline=True) if kind == "text"
                            else field_text.metadata(raw, f"{label} {shown}{ext}"))
    return Fields(values.get("text"), values.get("meta")) if values else NO_FIELDS


UNREADABLE_FOLDER = "folder cannot be listed (permission denied?): the images in it are not in the dataset"


def dangling_reason(path: str) -> str:
    """The skip reason of a symlink to nothing where a split or class folder would be."""
    try:
        target = f" (to {printable(os.readlink(path))})"
    except OSError:
        target = ""
    return f"dangling symlink{target}: no folder there, the images it would hold are not in the dataset"


class DiskTree:
    """A folder on disk, as the scan sees it; `unreadable`: the folders it could not list; `dangling`:
    the symlinks to nothing found where split and class folders are listed; `sidecars`: per folder
    walked, the kinds of sidecar found beside its images."""

    sizes: dict[str, int] | None = None

    def __init__(self, root: str | Path | None = None) -> None:
        self.unreadable: list[str] = []
        self.dangling: dict[str, None] = {}  # insertion-ordered set: a folder may be listed twice
        self.sidecars: dict[str, set[str]] = {}
        self.read_sidecar = read_optional if root is None else sidecar_reader(root)  # links inside root followed

    def subdirs(self, folder: Any) -> list[str]:
        names = []
        for e in os.scandir(folder):
            if e.name.startswith("."):
                continue
            if e.is_dir():
                names.append(e.name)
            elif e.is_symlink() and not os.path.exists(e.path):  # a class folder linked to storage now gone
                self.dangling[e.path] = None
        return sorted(names)

    def images(self, folder: Any) -> list[Path]:
        return walk_images(folder, self.unreadable, self.sidecars.setdefault(str(folder), set()), self.dangling)

    def relpaths(self, folder: Any) -> list[tuple[str, str]]:
        return walk_relpaths(folder, self.unreadable, self.sidecars.setdefault(str(folder), set()), self.dangling)

    def unreadable_under(self, root: Path, split_dir: Path, *, top: bool = False) -> list[dict[str, str]]:
        """Skipped entries for the folders under `split_dir` that could not be listed, and for the dangling
        symlinks where folders are under it (`top`: also those beside the split folders, under `root`)."""
        def shown(f: str) -> str:
            return printable(Path(f).relative_to(root).as_posix())

        inside = [f for f in self.unreadable if Path(f).is_relative_to(split_dir)]
        links = [f for f in self.dangling if Path(f).is_relative_to(split_dir) or (top and Path(f).parent == root)]
        return ([{"path": shown(f) + "/", "reason": UNREADABLE_FOLDER} for f in inside]
                + [{"path": shown(f), "reason": dangling_reason(f)} for f in links])


class StoreTree:
    """Object names under a store prefix seen as a folder tree rooted at "/" (name -> size), indexed
    once by folder: ImageNet's 1.28M names scan in one pass, not one pass per class."""

    def __init__(self, sizes: dict[str, int], read: Callable[[str], bytes] | None = None) -> None:
        self.sizes = sizes
        self._read = read  # an object's bytes by name (the sidecars a scan reads)
        self.sidecars: dict[str, set[str]] = {}
        self._files: dict[PurePosixPath, list[PurePosixPath]] = defaultdict(list)
        self._dirs: dict[PurePosixPath, set[str]] = defaultdict(set)
        root = PurePosixPath("/")
        for name in sizes:
            path = PurePosixPath("/", name)
            self._files[path.parent].append(path)
            folder = path.parent
            while folder != root and folder.name not in self._dirs[folder.parent]:
                self._dirs[folder.parent].add(folder.name)
                folder = folder.parent

    def subdirs(self, folder: PurePosixPath) -> list[str]:
        return sorted(name for name in self._dirs.get(folder, ()) if not name.startswith("."))

    def images(self, folder: PurePosixPath) -> list[PurePosixPath]:
        found, todo, kinds = [], [folder], self.sidecars.setdefault(str(folder), set())
        while todo:
            here = todo.pop()
            found += [p for p in self._files.get(here, ()) if is_image_name(p.name)]
            kinds |= sidecar_kinds([p.name for p in self._files.get(here, ())])
            todo += [here / name for name in self._dirs.get(here, ())]
        return sorted(found, key=lambda p: (str(p.parent), p.name))

    def read_sidecar(self, path: str) -> bytes | None:
        """The object at `path` ("/" + its name), or None when the listing has none; one over
        SIDECAR_MAX_BYTES by the listing is BadDatasetFile, never downloaded."""
        size = self.sizes.get(path[1:])
        if size is None or self._read is None:
            return None
        if size > SIDECAR_MAX_BYTES:
            raise too_big(path[1:], size, SIDECAR_MAX_BYTES, "sidecar")
        return self._read(path[1:])


def detect_layout(root: Path, tree: DiskTree | StoreTree = DiskTree()) -> str:
    """'splits' when a top-level folder is named like a split (train, val, ...), else 'classes'."""
    return "splits" if any(name.lower() in SPLIT_NAMES for name in tree.subdirs(root)) else "classes"


def _split_class_files(split_dir: Any, tree: DiskTree | StoreTree) -> dict[str, list[Any]]:
    return {name: tree.images(split_dir / name) for name in tree.subdirs(split_dir)}


def _label_files(root: Any, split_dir: Any, files_by_class: dict[str, list[Any]], classes: ClassIndex,
                 tree: DiskTree | StoreTree, skipped: list[dict[str, str]]) -> list[ImageFile]:
    """Each file's ImageFile, its sidecars read; a file whose sidecar is bad goes to `skipped`."""
    taken: set[str] = set()
    out = []
    for name, files in files_by_class.items():
        label, kinds = classes.label(name), tree.sidecars.get(str(split_dir / name), set())
        for path in files:
            key = make_key(printable(path.relative_to(split_dir).as_posix()), taken)
            relpath = path.relative_to(root).as_posix()
            shown, fields = printable(relpath), NO_FIELDS
            if kinds:
                try:
                    fields = read_sidecars(str(path), shown, kinds, tree.read_sidecar)
                except ValueError as exc:
                    skipped.append({"path": shown, "reason": str(exc)})
                    continue
            out.append(ImageFile(path, shown, label, key, None if tree.sizes is None else tree.sizes[relpath], fields))
    return out


def _no_images_error(root: Path) -> ValueError:
    return ValueError(
        f"Found 0 images in class folders of {root}. Expected {root}/CLASS/*.jpg or {root}/SPLIT/CLASS/*.jpg "
        f"(or a flat folder with --labels FILE). Supported image extensions are {', '.join(IMAGE_EXTENSIONS)}"
    )


def _tree(root: str | Path) -> tuple[Any, DiskTree | StoreTree]:
    """Where to scan: a folder on disk, or a store prefix's listing (one LIST, paginated by obstore)."""
    if is_url(root):
        from ..storage import RemoteStore

        store = RemoteStore(str(root))
        return PurePosixPath("/"), StoreTree(store.list(), store.read)
    root = Path(root)
    if not root.is_dir():
        raise ValueError(f"{root} is not a folder; expected an image folder laid out as {root}/CLASS/*.jpg")
    return root, DiskTree(root)


def _split_dirs(root: Any, tree: DiskTree | StoreTree, layout: str, split: str) -> dict[str, Any]:
    """Each split's folder: `root/SPLIT` for every split in the splits layout, else `root` as `split`."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if layout == "auto":
        layout = detect_layout(root, tree)
    if layout == "splits":
        return {name: root / name for name in tree.subdirs(root)}
    return {split: root}


def _class_index(by_split: dict[str, dict[str, list[Any]]]) -> ClassIndex:
    """The train split's classes (every split's when there is no train split)."""
    train = next((s for s in ("train", "training") if s in by_split), None)
    if train is not None:
        return ClassIndex(sorted(by_split[train]))
    return ClassIndex(sorted({c for classes in by_split.values() for c in classes}))


def _with_images(by_split: dict[str, dict[str, list[Any]]], shown: Any) -> dict[str, dict[str, list[Any]]]:
    by_split = {s: c for s, c in by_split.items() if any(c.values())}
    if not by_split:
        raise _no_images_error(shown)
    return by_split


def scan_folder(root: str | Path, *, layout: str = "auto", split: str = "train") -> FolderLayout:
    """Scan `root/class/*` (one split named `split`) or `root/split/class/*` (every split); `root`
    may be an object-store URL (the files' paths are then relative to it, from "/")."""
    shown = root
    root, tree = _tree(root)
    split_dirs = _split_dirs(root, tree, layout, split)
    by_split = _with_images({name: _split_class_files(d, tree) for name, d in split_dirs.items()}, shown)
    classes = _class_index(by_split)
    splits, skipped = {}, {}
    for name, files_by_class in by_split.items():
        unknown = [c for c in files_by_class if c not in classes]
        skipped[name] = [
            {"path": printable(p.relative_to(root).as_posix()),
             "reason": f"class {c!r} is not in the train split's class list"}
            for c in unknown for p in files_by_class[c]
        ]
        if isinstance(tree, DiskTree):  # a dangling link beside the split folders: in the first split's list
            skipped[name] += tree.unreadable_under(root, split_dirs[name], top=name == next(iter(by_split)))
        known = {c: f for c, f in files_by_class.items() if c in classes}
        splits[name] = _label_files(root, split_dirs[name], known, classes, tree, skipped[name])
    return FolderLayout(root, classes, splits, skipped)


def scan_split_compact(root: Path, split: str = "train", sidecars: set[str] | None = None,
                       ) -> tuple[ClassIndex, list[str], Iterator[tuple[bytes, str, int]]]:
    """A folder on disk scanned as scan_folder does (same files, order, labels and keys) for one
    split, without its ~1 KB of objects a file: the classes, the splits found, and for each of the
    split's files (its path relative to `root` as the filesystem spells it, its key, its label).
    The kinds of sidecar ("text", "meta") found beside the split's images are added to `sidecars`."""
    root, tree = _tree(root)
    split_dirs = _split_dirs(root, tree, "auto", split)
    by_split = _with_images({name: {c: tree.relpaths(d / c) for c in tree.subdirs(d)}
                             for name, d in split_dirs.items()}, root)
    classes = _class_index(by_split)
    if sidecars is not None and split in by_split:
        for name in by_split[split]:
            if name in classes:
                sidecars |= tree.sidecars.get(str(split_dirs[split] / name), set())
    for entry in tree.unreadable_under(root, split_dirs[split], top=True) if split in split_dirs else ():
        log.warning("%s: %s", entry["path"], entry["reason"])

    def files() -> Iterator[tuple[bytes, str, int]]:
        prefix = "" if split_dirs[split] == root else f"{split}/"
        taken: set[str] = set()
        for name, found in by_split[split].items():
            if name not in classes:
                continue
            label = classes.label(name)
            for sub, file in found:
                relpath = f"{name}/{sub}/{file}" if sub else f"{name}/{file}"
                yield os.fsencode(prefix + relpath), make_key(printable(relpath), taken), label

    return classes, sorted(by_split), files() if split in by_split else iter(())


def scan_labelled(root: str | Path, labels_csv: str | Path, *, split: str = "val") -> FolderLayout:
    """Scan a flat folder whose classes come from a CSV of `filename,class` rows (ImageNet's raw val)."""
    root, labels_csv = Path(root), Path(labels_csv)
    if not labels_csv.is_file():
        raise ValueError(f"labels file {labels_csv} does not exist; expected a CSV of filename,class rows")
    with open(labels_csv, newline="", encoding="utf-8") as fh:
        rows = [r for r in csv.reader(fh) if r and not r[0].startswith("#")]
    if rows and [c.strip().lower() for c in rows[0][:2]] == ["filename", "class"]:
        rows = rows[1:]
    bad = [r for r in rows if len(r) < 2]
    if bad:
        raise ValueError(f"{labels_csv}: row {bad[0]!r} is not 'filename,class'")
    wanted = {r[0].strip(): r[1].strip() for r in rows}
    classes = ClassIndex(sorted(set(wanted.values())))
    tree = DiskTree(root)
    present = {printable(p.relative_to(root).as_posix()): p for p in tree.images(root)}
    kinds = tree.sidecars.get(str(root), set())
    taken: set[str] = set()
    files, skipped = [], []
    for relpath, path in present.items():
        if relpath not in wanted:
            skipped.append({"path": relpath, "reason": f"no label in {labels_csv.name}"})
            continue
        key = make_key(relpath, taken)
        try:
            fields = read_sidecars(str(path), relpath, kinds, tree.read_sidecar) if kinds else NO_FIELDS
        except ValueError as exc:
            skipped.append({"path": relpath, "reason": str(exc)})
            continue
        files.append(ImageFile(path, relpath, classes.label(wanted[relpath]), key, fields=fields))
    skipped += [{"path": r, "reason": "listed in the labels file but missing"} for r in wanted if r not in present]
    skipped += tree.unreadable_under(root, root)
    if not files:
        raise _no_images_error(root)
    return FolderLayout(root, classes, {split: files}, {split: skipped})
