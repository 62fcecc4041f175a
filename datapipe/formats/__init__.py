"""Every dataset kind behind one dispatch (kinds.py: URL, Parquet, other tools' shards, packed, folder) and
the packed formats' registry (FORMATS: a manifest names its format, never guessed). May import storage,
image, records and the leaves."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Callable

from ..records import MANIFEST_NAME, Manifest, SplitNotFound
from ..storage import RemoteLocation, RemoteStore, ShardCache, StoreNotFound, is_url
from ..storage.dataset_files import MANIFEST_MAX_BYTES
from . import hdf5, lmdb, wds
from .base import Dataset, DatasetReplaced, Writer
from .folder import FolderDataset
from .kinds import DatasetKind, dataset_kinds, kind_of, opened, register_kind, unregister_kind
from .parquet import ParquetDataset, is_parquet_pattern
from .trusted import check_sha256
from .wds_foreign import ForeignShardsDataset, shard_folder

PARTIAL_SUFFIX = ".partial"


@dataclass(frozen=True)
class FormatSpec:
    """One packed format: its name, the destination suffixes that select it, reader and writer."""

    name: str
    suffixes: tuple[str, ...]
    reader: Callable[[Path, Manifest, str], Dataset]
    writer: type[Writer]
    read_manifest: Callable[[Path], Manifest | None]
    sharded: bool = False  # read shard by shard: shuffled at write time, rolled by size


FORMATS: dict[str, FormatSpec] = {
    spec.name: spec
    for spec in (
        FormatSpec(lmdb.NAME, lmdb.SUFFIXES, lmdb.LmdbDataset, lmdb.LmdbWriter, lmdb.read_manifest),
        FormatSpec(hdf5.NAME, hdf5.SUFFIXES, hdf5.Hdf5Dataset, hdf5.Hdf5Writer, hdf5.read_manifest),
        FormatSpec(wds.NAME, wds.SUFFIXES, wds.WdsDataset, wds.WdsWriter, wds.read_manifest, sharded=True),
    )
}


def format_for(dst: str | Path, name: str | None = None) -> FormatSpec:
    """The format named, or the one the destination's suffix selects."""
    if name is not None:
        if name not in FORMATS:
            raise ValueError(f"unknown format {name!r}; choose one of {sorted(FORMATS)}")
        return FORMATS[name]
    suffix = Path(dst).suffix.lower()
    for spec in FORMATS.values():
        if suffix in spec.suffixes:
            return spec
    known = ", ".join(f"{s} ({spec.name})" for spec in FORMATS.values() for s in spec.suffixes)
    raise ValueError(f"cannot tell the format of {dst}: its suffix {suffix!r} is none of {known}; "
                     "rename it or pass --format lmdb|hdf5|wds")


def staging_path(dst: str | Path) -> Path:
    """Where a conversion to `dst` writes until it is complete."""
    dst = Path(dst)
    return dst.with_name(dst.name + PARTIAL_SUFFIX)


def _interrupted(path: Path, staging: Path) -> ValueError:
    return ValueError(
        f"{path} is incomplete: a conversion into it was interrupted (its files are in {staging}). "
        f"Run `datapipe convert SRC {path} --resume` to finish it, or --overwrite to start over.")


def read_remote_manifest(store: RemoteStore) -> Manifest:
    """The manifest of a dataset in an object store (written last: no manifest, no finished dataset)."""
    try:
        text = store.read(MANIFEST_NAME, limit=MANIFEST_MAX_BYTES, what="manifest")
    except StoreNotFound:
        suffix = PurePosixPath(store.describe().rstrip("/")).suffix.lower()
        named = next((spec.name for spec in FORMATS.values() if suffix in spec.suffixes), None)
        if named is not None and named != wds.NAME:  # an LMDB or HDF5 file uploaded whole: no manifest beside it
            raise ValueError(f"{store.describe()} is named as a {named} dataset: only .wds datasets stream from "
                             "object storage. Download it to a local disk, or convert the images to .wds") from None
        raise StoreNotFound(f"{store.describe(MANIFEST_NAME)} does not exist: {store.describe()} is not a datapipe "
                            "dataset, or its conversion did not finish (`datapipe convert SRC URL --resume`)") from None
    return Manifest.from_json(text.decode("utf-8"), source=store.describe(MANIFEST_NAME))


def read_manifest(path: str | Path) -> Manifest | None:
    """The manifest of a packed dataset, None for anything else (such as a plain image folder)."""
    if is_url(path):
        return read_remote_manifest(RemoteStore(str(path)))
    path = Path(path)
    for spec in FORMATS.values():
        manifest = spec.read_manifest(path)
        if manifest is not None:
            return manifest
    return None


def open_remote(url: str, split: str, *, cache_dir: Path | None, cache_limit: int | None) -> Dataset:
    """A `.wds` dataset in an object store, read through the node's shard cache."""
    store = RemoteStore(url)
    manifest = read_remote_manifest(store)
    if manifest.format != wds.NAME:
        raise ValueError(f"{store.describe()} is a {manifest.format} dataset: only .wds datasets stream from object "
                         "storage. Download it to a local disk, or convert the images to .wds")
    cache = ShardCache(store, cache_dir, cache_limit)
    return wds.WdsDataset(url.rstrip("/"), manifest, split, location=RemoteLocation(store, cache))


def _cache(cache_dir: str | Path | None) -> Path | None:
    return Path(cache_dir) if cache_dir else None


def _open_url(path: str | Path, split: str, *, cache_dir: str | Path | None, cache_limit: int | None) -> Dataset:
    return open_remote(str(path), split, cache_dir=_cache(cache_dir), cache_limit=cache_limit)


def _open_parquet(path: str | Path, split: str, **_: object) -> Dataset:
    return ParquetDataset(path, split)  # Hugging Face Hub Parquet files, read in place (datapipe.formats.parquet)


def _refuse_staging(path: str | Path, split: str, **_: object) -> Dataset:
    """A conversion's staging folder: never read as other tools' shards."""
    raise _interrupted(Path(path).with_name(Path(path).name[: -len(PARTIAL_SUFFIX)]), Path(path))


def _other_tools_shards(path: str | Path) -> bool:
    pattern = isinstance(path, str) and (path.endswith(".tar") or ("{" in path and not Path(path).exists()))
    return pattern or (Path(path).is_dir() and bool(shard_folder(path)) and read_manifest(path) is None)


def _open_shards(path: str | Path, split: str, *, cache_dir: str | Path | None, **_: object) -> Dataset:
    if split != "train":
        raise SplitNotFound(f"split {split!r} not in {path}: a shard pattern is one split (read as 'train'); "
                            "open the other split's shards by their own pattern")
    return ForeignShardsDataset(str(path), cache_dir=_cache(cache_dir))  # img2dataset's, or a shard pattern


def _packed(path: str | Path) -> bool:
    return Path(path).exists() and read_manifest(path) is not None


def _open_packed(path: str | Path, split: str, **_: object) -> Dataset:
    path = Path(path)
    manifest = read_manifest(path)
    if manifest is None:  # removed since it was claimed
        raise FileNotFoundError(f"{path}'s manifest is gone: it is no longer a datapipe dataset")
    if manifest.format not in FORMATS:
        raise ValueError(f"{path} has format {manifest.format!r}, which this datapipe cannot read ({sorted(FORMATS)})")
    dataset = FORMATS[manifest.format].reader(path, manifest, split)
    if dataset.identity is not None:  # the manifest was read before the reader took the identity: re-read it
        dataset.identity.check(reread=True)
    return dataset


def _folder(path: str | Path) -> bool:
    return Path(path).is_dir() and not (Path(path) / MANIFEST_NAME).exists()


def _open_folder(path: str | Path, split: str, *, cache_dir: str | Path | None, **_: object) -> Dataset:
    return FolderDataset(Path(path), split, cache_dir=cache_dir)  # its shared index goes there


for _kind in (DatasetKind("url", is_url, _open_url, 10),
              DatasetKind("parquet", is_parquet_pattern, _open_parquet, 20),
              DatasetKind("staging", lambda p: Path(p).name.endswith(PARTIAL_SUFFIX), _refuse_staging, 25),
              DatasetKind("shards", _other_tools_shards, _open_shards, 30),
              DatasetKind("packed", _packed, _open_packed, 40),
              DatasetKind("folder", _folder, _open_folder, 90)):
    register_kind(_kind)


def open_dataset(path: str | Path, split: str = "train", *, cache_dir: str | Path | None = None,
                 cache_limit: int | None = None, sha256: str | None = None) -> Dataset:
    """Open one split of a packed dataset (LMDB, HDF5, WebDataset), of a plain image folder, or
    WebDataset shards written by other tools (`shards/train-{000000..000009}.tar`, or a folder of shards
    and their sidecars as img2dataset writes it), or Parquet files in the Hugging Face Hub's layout
    (`data/*.parquet`, the split from the file names). A `.wds` dataset may also be a URL (s3://,
    gs://, az://, http(s)://): its shards are fetched whole into `cache_dir` (default: node-local,
    $TMPDIR/datapipe-UID/shards), kept under `cache_limit` bytes, least recently used first, files in
    use never evicted (datapipe.storage.cache). `sha256`: for LMDB and HDF5, whose C libraries do not
    defend against crafted files, the sha256 you trust of the file they parse (the .h5 file, an LMDB
    folder's data.mdb), checked before anything opens it (one read of the file). Which kind a path is:
    the first of datapipe.formats.kinds that claims it."""
    if sha256 is not None:
        check_sha256(path, sha256)
    kind = kind_of(path)
    if kind is not None:
        return opened(kind, kind.open(path, split, cache_dir=cache_dir, cache_limit=cache_limit))
    path = Path(path)
    staging = staging_path(path)
    if not path.exists():
        if staging.exists():
            raise _interrupted(path, staging)
        raise FileNotFoundError(f"{path} does not exist")
    raise ValueError(f"{path} is not a datapipe dataset (no manifest) nor an image folder")


__all__ = ["FORMATS", "FormatSpec", "Dataset", "DatasetReplaced", "Writer", "open_dataset", "read_manifest",
           "format_for", "staging_path", "DatasetKind", "register_kind", "unregister_kind", "dataset_kinds"]
