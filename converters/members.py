"""An input image inside a container file (`Member`): here, a byte range of an archive, a member
of a tar (or of a tar inside a tar); converters.parquet has a Parquet file's rows.

A tar stores its members uncompressed, one after another, so a member of a per-class tar inside
ImageNet's `ILSVRC2012_img_train.tar` is simply bytes `offset .. offset + size` of the outer file:
the scan indexes the headers once, and workers read the range with pread, in any order, in parallel,
and again on --resume. Nothing is extracted to disk.

`ArchiveMember` is the task's path: a str that reads as the member's place
(`/data/ILSVRC2012_img_train.tar:n01440764.tar:n01440764_10026.JPEG`, what messages show) and carries
the range; it pickles with it, so forked workers and Ray tasks open it like any file
(`converters.inputs.open_input`).
"""
from __future__ import annotations

import os
from typing import Any, BinaryIO

from datapipe.image.headers import BadImageError


class Member(str):
    """An input inside a container file (`archive`): a tar member, a Parquet row (converters.parquet).
    Read through `opened`; statted (for --resume) through its archive; an archive that cannot be
    read is the run's error, not each member's (converters.inputs)."""

    __slots__ = ("archive",)
    archive: str

    def opened(self, archive: BinaryIO) -> Any:
        """The member as a file to `read()`, given its archive opened for reading."""
        raise NotImplementedError


class ArchiveMember(Member):
    """The place of an archive member, as text, with the archive's path and the member's byte range."""

    __slots__ = ("offset", "size")

    def __new__(cls, text: str, archive: str, offset: int, size: int) -> "ArchiveMember":
        self = super().__new__(cls, text)
        self.archive, self.offset, self.size = archive, offset, size
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        return ArchiveMember, (str(self), self.archive, self.offset, self.size)

    def opened(self, archive: BinaryIO) -> "MemberFile":
        return MemberFile(archive, self)


class MemberFile:
    """A member opened for reading: `read()` gives its bytes (one pread); `fileno()` is the archive's,
    so the archive's identity (device, inode, size, mtime) stands for the member's."""

    def __init__(self, archive: BinaryIO, member: ArchiveMember) -> None:
        self.archive, self.member = archive, member

    def read(self) -> bytes:
        data = os.pread(self.archive.fileno(), self.member.size, self.member.offset)
        if len(data) != self.member.size:
            raise BadImageError(f"the archive ends inside this member ({len(data)} of {self.member.size} bytes): "
                                "truncated since it was indexed")
        return data

    def fileno(self) -> int:
        return self.archive.fileno()

    def close(self) -> None:
        self.archive.close()

    def __enter__(self) -> "MemberFile":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
