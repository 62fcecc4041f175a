"""A file you trust by its digest: LMDB and HDF5 datasets are parsed by C libraries (liblmdb,
libhdf5) that do not defend against crafted files, so a file from elsewhere is checked against the
sha256 its source gave you (what `sha256sum` prints) before either library sees it."""
from __future__ import annotations

import hashlib
import logging
import re
from pathlib import Path

from tqdm import tqdm

from . import hdf5, lmdb

log = logging.getLogger(__name__)


def parsed_file(path: str | Path) -> Path:
    """The file a C library parses when `path` is opened: an HDF5 file itself, an LMDB folder's data.mdb."""
    path = Path(path)
    if hdf5.is_hdf5(path):
        return path
    if (path / lmdb.DATA_FILE).is_file():
        return path / lmdb.DATA_FILE
    raise ValueError(f"{path} is neither an HDF5 file nor an LMDB folder: a sha256 checks the file their C libraries "
                     "parse; other datasets are read by datapipe's own code (check them with `datapipe verify`)")


def check_sha256(path: str | Path, expected: str, *, progress: bool = False) -> None:
    """A ValueError unless the file an LMDB or HDF5 dataset's C library parses has the sha256 you trust
    (what `sha256sum` prints); read in Python, before anything parses it: those parsers do not defend
    against crafted files."""
    want = expected.strip().lower()
    if not re.fullmatch(r"[0-9a-f]{64}", want):
        raise ValueError(f"sha256 {expected[:80]!r} is not 64 hex digits (what `sha256sum FILE` prints)")
    file = parsed_file(path)
    digest = hashlib.sha256()
    log.info("datapipe: checking the sha256 of %s before opening it", file)
    with open(file, "rb") as fh, tqdm(total=file.stat().st_size, unit="B", unit_scale=True,
                                       desc=f"sha256 {file.name}", disable=not progress) as bar:
        for chunk in iter(lambda: fh.read(8 << 20), b""):
            digest.update(chunk)
            bar.update(len(chunk))
    if digest.hexdigest() != want:
        raise ValueError(f"{file}: its sha256 is {digest.hexdigest()}, not the {want} you trust: it is another file "
                         "(changed, damaged or crafted); not opened")
