"""Open shard files through a small per-process LRU, so descriptors stay bounded however many shards."""
from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable

MAX_OPEN = 64
MAX_OPEN_CACHED = 2  # a remote dataset's reader pins the shard it reads and its neighbour, no more


class ShardFiles:
    """`pread(number, length, offset)` on shard `number`, opening it on first use and closing the least
    recently used one past `max_open`. `opener(number)` gives a read-only descriptor (for a remote
    dataset, of the cached copy, which stays pinned in the cache until closed: keep `max_open` small
    there). One instance per process: see `PerProcess`."""

    def __init__(self, opener: Callable[[int], int], *, max_open: int = MAX_OPEN) -> None:
        if max_open < 1:
            raise ValueError(f"max_open must be >= 1, got {max_open}")
        self.opener = opener
        self.max_open = max_open
        self._fds: OrderedDict[int, int] = OrderedDict()

    def fd(self, number: int) -> int:
        fd = self._fds.get(number)
        if fd is not None:
            self._fds.move_to_end(number)
            return fd
        while len(self._fds) >= self.max_open:
            os.close(self._fds.popitem(last=False)[1])
        fd = self._fds[number] = self.opener(number)
        return fd

    def pread(self, number: int, length: int, offset: int) -> bytes:
        fd = self.fd(number)
        if offset + length > os.fstat(fd).st_size:  # checked first: a length from a crafted manifest is not allocated
            data = b""
        else:
            data = os.pread(fd, length, offset)
        if len(data) != length:
            raise OSError(f"shard {number}: wanted {length} bytes at offset {offset}, the file has fewer; "
                          "it was truncated or replaced, run `datapipe verify`")
        return data

    def close(self) -> None:
        while self._fds:
            os.close(self._fds.popitem()[1])

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
