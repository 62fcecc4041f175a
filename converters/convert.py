"""`convert`: pack an image folder into a local dataset (converters.pack) or an object-store one
(converters.remote), or copy a packed dataset into another format (converters.repack); the one entry
point, so that none of those modules needs the others'."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from datapipe.storage import is_url, redact

from .engines import Engine
from .errors import ConvertError
from .pack import ConvertOptions, ConvertReport, convert_local
from .remote import convert_to_url
from .repack import packed_source, repack


def convert(src: str | Path, dst: str | Path, options: ConvertOptions = ConvertOptions(), *,
            engine: Engine | None = None) -> ConvertReport:
    """Pack the image folder `src` into `dst` (format from its suffix or options.format); `dst` may be
    an object-store URL (s3://, gs://, az://) for .wds. `engine` (.wds only) overrides the one
    `options.engine` names, e.g. `RayEngine("auto", max_retries=5)`. A packed `src` (LMDB, HDF5, .wds)
    has its records copied into `dst`'s format as they are (converters.repack)."""
    if engine is not None and engine.name != options.engine:
        options = replace(options, engine=engine.name)
    packed = packed_source(src)
    if packed is not None:
        if is_url(dst):
            raise ConvertError(f"{redact(str(dst))}: a packed dataset is repacked to a local path; repack it to a local "
                               ".wds, then copy that folder to the store")
        return repack(src, Path(dst), options, packed)
    if is_url(dst):
        return convert_to_url(src, str(dst), options, engine)
    return convert_local(src, Path(dst), options, engine)
