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

    def __init__(self, path: str, reason: str, kind: str | None = None) -> None:
        super().__init__(f"{path} {reason}")
        self.path, self.reason, self.kind = path, reason, kind  # kind: what it is, when not a regular file


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


def open_regular(path: str, *, what: str, fix: str, root: str | None = None, links_out: bool = True) -> int:
    """A blocking read-only descriptor of `path` once it proved a regular file (opened non-blocking,
    checked on the descriptor: a FIFO never blocks, a device is never read); BadDatasetFile for a link
    out of `root` (unless `links_out`) or another kind of file, saying `fix`. FileNotFoundError as
    os.open raises it. The caller closes the descriptor."""
    try:
        fd = _open(path, root, links_out)
    except OSError as exc:
        if exc.errno != errno.ENXIO:  # a socket: no device or address to open
            raise
        raise BadDatasetFile(path, f"is a socket, not a regular file; a {what} must be a file: {fix}", "a socket") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = file_kind(info.st_mode)
            raise BadDatasetFile(path, f"is {kind}, not a regular file; a {what} must be a file: {fix}", kind)
        os.set_blocking(fd, True)
        return fd
    except BaseException:
        os.close(fd)
        raise


def read_dataset_file(path: str, *, limit: int, what: str, root: str | None = None,
                      links_out: bool = False) -> bytes | None:
    """The bytes of `path` (a `what`: "sidecar", "manifest"), or None when there is no such file.
    BadDatasetFile for a link out of `root` (unless `links_out`), a file that is not a regular file,
    or one over `limit` bytes; OSError when it cannot be read (permission denied)."""
    try:
        fd = open_regular(path, what=what, fix="replace it with one, or remove it", root=root, links_out=links_out)
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        size = os.fstat(fd).st_size
        chunks, got = [], 0 if size <= limit else size  # a file that grows: the reads tell
        while got <= limit and (chunk := os.read(fd, min(_CHUNK, limit + 1 - got))):
            chunks.append(chunk)
            got += len(chunk)
        if got > limit:
            raise too_big(path, max(size, got), limit, what)
        return b"".join(chunks)
    finally:
        os.close(fd)


def index_limit(shard_bytes: int) -> int:
    """The most bytes a DALI `.idx` of a tar of `shard_bytes` may hold: a line entry (ext, offset,
    size, name) is shorter than the 512-byte header each member costs the tar, plus 16 MiB for indexes
    that list members more than once (a 2 KB shard's index of 100,000 samples is a test's)."""
    return max(0, int(shard_bytes)) + (16 << 20)
