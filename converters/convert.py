"""`convert`: pack an image folder into a local dataset (converters.pack) or an object-store one
(converters.remote); the one entry point, so that neither module needs the other's."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from datapipe.storage import is_url

from .engines import Engine
from .pack import ConvertOptions, ConvertReport, convert_local
from .remote import convert_to_url


def convert(src: str | Path, dst: str | Path, options: ConvertOptions = ConvertOptions(), *,
            engine: Engine | None = None) -> ConvertReport:
    """Pack the image folder `src` into `dst` (format from its suffix or options.format); `dst` may be
    an object-store URL (s3://, gs://, az://) for .wds. `engine` (.wds only) overrides the one
    `options.engine` names, e.g. `RayEngine("auto", max_retries=5)`."""
    if engine is not None and engine.name != options.engine:
        options = replace(options, engine=engine.name)
    if is_url(dst):
        return convert_to_url(src, str(dst), options, engine)
    return convert_local(src, Path(dst), options, engine)
