"""`convert SRC s3://bucket/out.wds`: convert into a local work folder, upload each shard as soon as it
is finished, the offsets files after them and the manifest last.

A dataset in a store without its manifest does not open, so an interrupted conversion never looks
whole; the work folder (under the cache folder) keeps the local progress, and `--resume` finishes
the conversion and uploads whatever the store lacks. Only `.wds` is written to stores: LMDB and
HDF5 are single files a reader must have whole on a disk.
"""
from __future__ import annotations

import dataclasses
import hashlib
import logging
import threading
from pathlib import Path
from urllib.parse import urlsplit

from datapipe.formats import format_for, staging_path
from datapipe.records import MANIFEST_NAME
from datapipe.storage import RemoteStore, default_cache_dir, redact

from .pack import ConvertError, ConvertOptions, ConvertReport, convert
from .staging import remove

log = logging.getLogger(__name__)
POLL_S = 0.5


def work_folder(url: str) -> Path:
    """The local folder a conversion to `url` is built in (kept between --resume runs)."""
    name = Path(urlsplit(url).path).name or "dataset.wds"
    return default_cache_dir() / "convert" / hashlib.sha256(redact(url).encode()).hexdigest()[:16] / name


class ShardUploader:
    """Uploads finished shards (their `.idx` exists: it is written after the shard is complete) from
    a folder, in a background thread, skipping what the store already holds at the same size."""

    def __init__(self, store: RemoteStore, folder: Path, present: dict[str, int]) -> None:
        self.store, self.folder, self.present = store, folder, dict(present)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="datapipe-upload", daemon=True)
        self.error: BaseException | None = None

    def start(self) -> "ShardUploader":
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            while not self._stop.wait(POLL_S):
                self.upload_finished_shards()
        except BaseException as exc:  # raised on the main thread by stop()
            self.error = exc

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        if self.error is not None:
            raise self.error

    def upload_finished_shards(self) -> None:
        for idx in sorted(self.folder.glob("*.idx")):
            tar = idx.with_suffix(".tar")
            if tar.exists():
                self.upload(tar)
                self.upload(idx)

    def upload(self, file: Path) -> None:
        size = file.stat().st_size
        if self.present.get(file.name) != size:
            self.store.upload(file.name, file)
            self.present[file.name] = size
            log.info("uploaded %s (%d bytes)", self.store.describe(file.name), size)


def _check_store(store: RemoteStore, url: str, options: ConvertOptions, local: Path) -> dict[str, int]:
    """What the store holds under url; refuses what `convert` refuses for a local destination."""
    present = store.list()
    if MANIFEST_NAME in present and not options.overwrite:
        if options.resume:
            raise ConvertError(f"{redact(url)} is complete: there is nothing to resume (--overwrite converts it again)")
        raise ConvertError(f"{redact(url)} already exists; pass --overwrite to replace it")
    if present and MANIFEST_NAME not in present and not (options.resume or options.overwrite):
        raise ConvertError(f"an interrupted conversion left {len(present)} objects under {redact(url)}; "
                           "pass --resume to finish it or --overwrite to start over")
    if options.resume and not (local.exists() or staging_path(local).exists()):
        raise ConvertError(f"cannot resume {redact(url)}: the interrupted conversion's local work folder "
                           f"{local.parent} is gone (it was on another machine, or removed); --overwrite starts over")
    return present


def convert_to_url(src: str | Path, url: str, options: ConvertOptions) -> ConvertReport:
    """Convert `src` into the object-store folder `url` (a `.wds` dataset)."""
    spec = format_for(urlsplit(url).path, options.format)
    if spec.name != "wds":
        raise ConvertError(f"{redact(url)}: only .wds datasets can be written to object storage ({spec.name} is a "
                           "single file a reader needs whole on a disk); convert to a local path, or to .wds")
    store = RemoteStore(url)
    local = work_folder(url)
    present = _check_store(store, url, options, local)
    if options.overwrite and MANIFEST_NAME in present:
        store.delete(MANIFEST_NAME)  # the old dataset stops opening before any of it is replaced
        del present[MANIFEST_NAME]
    if options.overwrite:
        remove(local)
        remove(staging_path(local))
    local.parent.mkdir(parents=True, exist_ok=True)
    if local.exists():  # interrupted after the local conversion finished: only uploads are left
        report = _local_report(local)
    else:
        uploader = ShardUploader(store, staging_path(local), present).start()
        try:
            report = convert(src, local, dataclasses.replace(options, overwrite=False))
        finally:
            uploader.stop()
        present = uploader.present
    _finish_upload(store, local, present)
    remove(local.parent)
    return dataclasses.replace(report, dst=url)  # type: ignore[arg-type]


def _finish_upload(store: RemoteStore, local: Path, present: dict[str, int]) -> None:
    """Every file of the finished local dataset the store lacks, stale objects removed, manifest last."""
    uploader = ShardUploader(store, local, present)
    files = sorted(p for p in local.iterdir() if p.is_file() and p.name != MANIFEST_NAME)
    for file in files:
        uploader.upload(file)
    for stale in set(present) - {f.name for f in files} - {MANIFEST_NAME}:
        store.delete(stale)
    store.upload(MANIFEST_NAME, local / MANIFEST_NAME)


def _local_report(local: Path) -> ConvertReport:
    from datapipe.formats import read_manifest

    manifest = read_manifest(local)
    return ConvertReport(local, manifest.format, manifest.splits, manifest.seconds, 0)
