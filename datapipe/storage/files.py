"""Open shard files through a small per-process LRU, so descriptors stay bounded however many shards."""
from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable

MAX_OPEN = 64


class ShardFiles:
    """`pread(number, length, offset)` on shard `number`, opening it on first use and closing the least
    recently used one past `max_open`. `locate(number)` gives the local path to open (for a remote
    dataset it fetches the shard into the cache first). One instance per process: see `PerProcess`."""

    def __init__(self, locate: Callable[[int], str], *, max_open: int = MAX_OPEN) -> None:
        if max_open < 1:
            raise ValueError(f"max_open must be >= 1, got {max_open}")
        self.locate = locate
        self.max_open = max_open
        self._fds: OrderedDict[int, int] = OrderedDict()

    def fd(self, number: int) -> int:
        fd = self._fds.get(number)
        if fd is not None:
            self._fds.move_to_end(number)
            return fd
        while len(self._fds) >= self.max_open:
            os.close(self._fds.popitem(last=False)[1])
        fd = self._fds[number] = os.open(self.locate(number), os.O_RDONLY)
        return fd

    def pread(self, number: int, length: int, offset: int) -> bytes:
        data = os.pread(self.fd(number), length, offset)
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
