"""`convert SRC s3://bucket/out.wds`: shard tasks build their shards in local scratch folders and
upload them (`.tar`, `.idx`, then the record list); the driver uploads the offsets files, the shard
tables and the manifest last, then removes the record lists and whatever an older dataset there left.

A dataset in a store without its manifest does not open, so an interrupted conversion never looks
whole, and `--resume` (from any machine) keeps every shard whose record list is in the store. Only
`.wds` is written to stores: LMDB and HDF5 are single files a reader must have whole on a disk.
"""
from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from urllib.parse import urlsplit

from datapipe.formats import format_for
from datapipe.formats.wds_index import idx_name
from datapipe.records import MANIFEST_NAME
from datapipe.storage import redact

from .engines import Engine
from .pack import ConvertError, ConvertOptions, ConvertReport, prepare, run_sharded
from .targets import LIST_SUFFIX, StoreTarget

log = logging.getLogger(__name__)


def _check_store(present: dict[str, int], url: str, options: ConvertOptions) -> None:
    """Refuse what `convert` refuses for a local destination."""
    if MANIFEST_NAME in present and not options.overwrite:
        if options.resume:
            raise ConvertError(f"{redact(url)} is complete: there is nothing to resume (--overwrite converts it again)")
        raise ConvertError(f"{redact(url)} already exists; pass --overwrite to replace it")
    if present and MANIFEST_NAME not in present and not (options.resume or options.overwrite):
        raise ConvertError(f"an interrupted conversion left {len(present)} objects under {redact(url)}; "
                           "pass --resume to finish it or --overwrite to start over")


def convert_to_url(src: str | Path, url: str, options: ConvertOptions, engine: Engine | None = None) -> ConvertReport:
    """Convert `src` into the object-store folder `url` (a `.wds` dataset)."""
    spec = format_for(urlsplit(url).path, options.format)
    if spec.name != "wds":
        raise ConvertError(f"{redact(url)}: only .wds datasets can be written to object storage ({spec.name} is a "
                           "single file a reader needs whole on a disk); convert to a local path, or to .wds")
    target = StoreTarget(url)
    present = target.listing()
    _check_store(present, url, options)
    task_list, options = prepare(src, spec, options)
    if options.overwrite:  # the old dataset stops opening first; none of its record lists is reused
        for name in [MANIFEST_NAME] + [n for n in present if n.endswith(LIST_SUFFIX)]:
            if name in present:
                target.delete(name)
        options = dataclasses.replace(options, resume=False)
    result = run_sharded(src, target, task_list, spec, options, engine)
    written = {s["name"] for shards in result.shards.values() for s in shards}
    written |= {idx_name(name) for name in written}
    written |= {info.index["name"] for info in result.splits.values()} | {MANIFEST_NAME}
    written |= {info.table["name"] for info in result.splits.values()}
    for stale in sorted(set(target.listing()) - written):
        log.info("removing %s, left by an older dataset", target.describe(stale))
        target.delete(stale)
    return ConvertReport(url, spec.name, result.splits, result.seconds, result.processed)  # type: ignore[arg-type]
