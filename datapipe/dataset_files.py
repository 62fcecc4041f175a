"""The one way to read a file that came with a dataset (an image's caption or metadata sidecar, a
manifest): the author of the dataset, not its user, chose what is at the path.

- A link out: a file that is a symbolic link must resolve inside the dataset's root or inside the
  folder it is listed in (a link within the dataset is fine; one to ~/.aws/credentials is refused,
  never read, so it cannot become a caption). Manifests are exempt (`links_out`): they are parsed,
  never stored, and a symlinked copy of a dataset is common.
- Regular files only: opened with O_NONBLOCK, then fstat'ed; a FIFO, a device, a socket or a folder
  is refused without ever blocking or reading.
- A size bound: at most `limit` bytes are read; a bigger file is refused (SIDECAR_MAX_BYTES,
  MANIFEST_MAX_BYTES), so a link to /dev/zero or a 10 GB "caption" costs nothing.
A refusal is BadDatasetFile, a ValueError: `reason` says what is wrong and what to do, the caller
names the file as its user knows it.
"""
from __future__ import annotations

import errno
import os
import stat

from .durable import file_kind

SIDECAR_MAX_BYTES = 8 << 20  # a caption or JSON metadata file beside an image (docs/image-text.md)
MANIFEST_MAX_BYTES = 256 << 20  # a dataset's manifest.json (an ImageNet .wds manifest: ~1 MB)
_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_CHUNK = 1 << 20


class BadDatasetFile(ValueError):
    """A file of a dataset refused before it was read; `reason` without the path."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path} {reason}")
        self.path, self.reason = path, reason


def too_big(path: str, size: int, limit: int, what: str) -> BadDatasetFile:
    return BadDatasetFile(path, f"is {size:,} bytes, over the {limit:,} a {what} may hold; shorten it, or remove it")


def _inside(real: str, folder: str) -> bool:
    folder = os.path.realpath(folder)
    return real == folder or real.startswith(folder.rstrip(os.sep) + os.sep)


def _open(path: str, root: str | None, links_out: bool) -> int:
    """A read-only descriptor of `path`; a link resolving outside `root` and its listed folder refused."""
    if links_out:
        return os.open(path, _FLAGS)
    try:
        return os.open(path, _FLAGS | os.O_NOFOLLOW)  # not a link: it is in the folder it is listed in
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
    real = os.path.realpath(path)
    if not any(_inside(real, base) for base in (os.path.dirname(path) or ".", root) if base is not None):
        raise BadDatasetFile(path, f"is a link to {real}, outside the dataset; a dataset's files must lie inside "
                                   "it: replace the link with a copy of the file, or remove it")
    return os.open(real, _FLAGS | os.O_NOFOLLOW)  # a link swapped in since the check: ELOOP, not followed


def read_dataset_file(path: str, *, limit: int, what: str, root: str | None = None,
                      links_out: bool = False) -> bytes | None:
    """The bytes of `path` (a `what`: "sidecar", "manifest"), or None when there is no such file.
    BadDatasetFile for a link out of `root` (unless `links_out`), a file that is not a regular file,
    or one over `limit` bytes; OSError when it cannot be read (permission denied)."""
    try:
        fd = _open(path, root, links_out)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        if exc.errno != errno.ENXIO:  # a socket: no device or address to open
            raise
        raise BadDatasetFile(path, f"is a socket, not a regular file; a {what} must be a file: remove it") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise BadDatasetFile(path, f"is {file_kind(info.st_mode)}, not a regular file; a {what} must be a "
                                       "file: replace it with one, or remove it")
        chunks, got = [], 0 if info.st_size <= limit else info.st_size  # a file that grows: the reads tell
        while got <= limit and (chunk := os.read(fd, min(_CHUNK, limit + 1 - got))):
            chunks.append(chunk)
            got += len(chunk)
        if got > limit:
            raise too_big(path, max(info.st_size, got), limit, what)
        return b"".join(chunks)
    finally:
        os.close(fd)
