"""Where bytes live: a local folder or a URL (s3://, gs://, az://, http(s)://) behind one interface.
May import only the leaves (errors, names).

Formats read through a `Location`, never through a path directly, so they need not know whether a
file is on a disk or in a store: a remote file is read whole (`read_bytes`) or fetched into the shard
cache and opened from there (`open`, which pins the cached copy while the descriptor is open).
"""
from __future__ import annotations

import os
from pathlib import Path

from ..names import check_name
from .cache import CacheFull, ShardCache, default_cache_dir
from .dataset_files import open_regular
from .redaction import redact
from .urls import RemoteStore, RetryPolicy, StoreAccessDenied, StoreError, StoreNotFound, StoreUnavailable, is_url


class Location:
    """A dataset's folder on the local disk."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    @staticmethod
    def local(root: Path | str) -> "Location":
        return Location(Path(root))

    @property
    def remote(self) -> bool:
        return False

    def describe(self, name: str = "") -> str:
        return str(self.root / name) if name else str(self.root)

    def checked(self, name: str) -> str:
        """`name`, a name the dataset gave, refused unless it stays inside the dataset (datapipe.names)."""
        return check_name(name, f"{self.describe()}: file name")

    def file(self, name: str) -> Path:
        """The local path of `name` (checked)."""
        return self.root / self.checked(name)

    def read_bytes(self, name: str, *, limit: int, what: str) -> bytes:
        """The bytes of the dataset's file `name` (a `what`), at most `limit` of them: a regular file
        (links allowed), read through the one reader of a dataset's files (datapipe.storage.dataset_files)."""
        from .dataset_files import read_dataset_file

        data = read_dataset_file(str(self.file(name)), limit=limit, what=what, links_out=True)
        if data is None:
            raise FileNotFoundError(f"{self.describe(name)} does not exist")
        return data

    def read_ranges(self, name: str, ranges: list[tuple[int, int]]) -> list[bytes]:
        """The bytes of `name` in each (start, length) range (fewer where the file is shorter)."""
        fd = os.open(self.file(name), os.O_RDONLY)
        try:
            return [os.pread(fd, length, start) for start, length in ranges]
        finally:
            os.close(fd)

    def open(self, name: str, *, size: int | None = None, sha256: str | None = None) -> int:
        """A read-only file descriptor of `name` once it proved a regular file (a shard replaced by a FIFO
        blocked its reader for good; a device was read); the caller closes it."""
        return open_regular(str(self.file(name)), what="dataset's file",
                            fix="put back the file the dataset's manifest lists (datapipe verify checks them)")

    def prefetch(self, items: list[tuple[str, int | None, str | None]]) -> None:
        """Nothing to fetch on a local disk."""


class RemoteLocation(Location):
    """A dataset's folder in an object store, read through a node-local `ShardCache`."""

    def __init__(self, store: RemoteStore, cache: ShardCache) -> None:
        super().__init__(Path(cache.folder))
        self.store, self.cache = store, cache

    @property
    def remote(self) -> bool:
        return True

    def describe(self, name: str = "") -> str:
        return self.store.describe(name)

    def read_bytes(self, name: str, *, limit: int, what: str) -> bytes:
        return self.store.read(self.checked(name), limit=limit, what=what)

    def read_ranges(self, name: str, ranges: list[tuple[int, int]]) -> list[bytes]:
        """Bytes of `name` in the store, by ranged requests in one call (not through the cache: the
        caller checks them)."""
        return self.store.read_ranges(self.checked(name), ranges)

    def open(self, name: str, *, size: int | None = None, sha256: str | None = None) -> int:
        """A descriptor of the cached copy (downloaded first if need be), pinned until closed."""
        return self.cache.open(self.checked(name), size=size, sha256=sha256)

    def prefetch(self, items: list[tuple[str, int | None, str | None]]) -> None:
        self.cache.prefetch(items)


__all__ = ["CacheFull", "Location", "RemoteLocation", "RemoteStore", "RetryPolicy", "ShardCache", "StoreAccessDenied",
           "StoreError", "StoreNotFound", "StoreUnavailable", "default_cache_dir", "is_url", "redact"]
