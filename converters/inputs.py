"""Reading one input file: its bytes, or the reason it is a bad file.

A file the scan listed can still fail to open: a dangling symlink (image folders built from links
often hold a few), a file deleted or made unreadable since the scan. Those are bad files like a
corrupt one: skipped and listed with their reason, or where --strict stops. Any other error (EIO,
no memory, too many open files) is the system's, not the file's: it stops the run, naming the file,
and what was finished stays for --resume.
"""
from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from typing import BinaryIO

from datapipe.storage.dataset_files import BadDatasetFile, open_regular
from datapipe.image.headers import BadImageError

from .members import Member

_REASONS = {errno.EACCES: "permission denied", errno.EPERM: "permission denied",
            errno.ELOOP: "symlink loop", errno.EISDIR: "a folder, not a file"}


def unreadable_reason(path: str, exc: OSError) -> str | None:
    """Why the input `path` is a bad file, given the error that statting, opening or reading it
    raised; None when the error is not the file's own."""
    if exc.errno in (errno.ENOENT, errno.ENOTDIR):
        if not os.path.islink(path):
            return "file vanished after the scan"
        with contextlib.suppress(OSError):
            return f"dangling symlink (to {os.readlink(path)})"
        return "dangling symlink"
    return _REASONS.get(exc.errno)


@contextlib.contextmanager
def reading(path: str) -> Iterator[None]:
    """Open and read the input `path` inside: the file's own failure becomes a BadImageError with
    its reason; any other OSError goes on, naming the file."""
    try:
        yield
    except OSError as exc:
        # an archive that cannot be read is the run's error, not each of its members' (converters.members)
        reason = None if isinstance(path, Member) else unreadable_reason(path, exc)
        if reason is None:
            raise OSError(exc.errno, exc.strerror or str(exc), path) from exc
        raise BadImageError(reason) from None


def open_input(path: str) -> BinaryIO:
    """The input `path` opened for reading, when it is a regular file. A FIFO, socket or device
    named like an image (or linked to as one) is a bad file: opened without blocking, never read
    (a FIFO would block open() forever, /dev/zero would read forever). Call inside `reading`.
    A member of an archive (converters.members) opens its archive and reads only its own bytes."""
    if isinstance(path, Member):
        return path.opened(open_input(path.archive))  # type: ignore[no-any-return]
    try:  # the one open of a dataset's files (datapipe.storage.dataset_files)
        fd = open_regular(path, what="image file", fix="it is skipped")
    except BadDatasetFile as exc:
        raise BadImageError(f"not a regular file ({exc.kind})" if exc.kind else exc.reason) from None
    return os.fdopen(fd, "rb")


def read_input(path: str) -> bytes:
    """The bytes of the input `path`, or BadImageError saying why it cannot be read."""
    with reading(path), open_input(path) as fh:
        return fh.read()
