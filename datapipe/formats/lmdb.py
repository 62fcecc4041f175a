"""LMDB: one environment folder; key `split/0000000042`, value = the packed record (JSON meta + bytes)."""
from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lmdb

from ..records import Manifest, Record
from .base import (Dataset, DatasetReplaced, Identity, Writer, pack_record, read_dir_manifest, unpack_record,
                   write_dir_manifest)

NAME = "lmdb"
SUFFIXES = (".lmdb",)
_TXN_BYTES = 64 << 20
_MIN_MAP = 64 << 20
_MAX_READERS = 2048
DATA_FILE = "data.mdb"  # what the LMDB C library parses: check its sha256 first (datapipe.formats.trusted)


def record_key(split: str, index: int) -> bytes:
    return f"{split}/{index:010d}".encode()


_ENVS: dict[str, tuple[int, Identity, lmdb.Environment]] = {}


def shared_env(path: str, identity: Identity) -> lmdb.Environment:
    """This process's one read-only environment for `path`, of the dataset `identity` names.

    py-lmdb refuses a second open of one path in a process, and a forked child inherits the parent's
    open environments (unusable there): so one environment per path per process, and the inherited one
    is closed before the child opens its own (lock=False: no reader slot or lock is shared). Each open
    checks that the folder still holds the dataset opened (DatasetReplaced), before and after: an open
    environment keeps reading the file it mapped. Threads that open the same path at once (the threads
    backend, a thread-pool loader) take turns, so only one opens it.
    """
    entry = _ENVS.get(path)
    if entry is not None and entry[:2] == (os.getpid(), identity):
        return entry[2]
    with _OPENING:
        entry = _ENVS.get(path)
        if entry is not None and entry[:2] == (os.getpid(), identity):
            return entry[2]
        identity.check()  # before closing another dataset object's environment for a stale one
        if entry is not None:
            entry[2].close()
            del _ENVS[path]
        env = lmdb.open(path, readonly=True, lock=False, readahead=False, meminit=False,
                        max_readers=_MAX_READERS, subdir=True)
        try:
            identity.check()  # after the open: the file mapped is the one the manifest describes
        except DatasetReplaced:
            env.close()
            raise
        _ENVS[path] = (os.getpid(), identity, env)
        return env


def _new_opening_lock() -> None:
    """A forked child gets a free lock (another thread may have held the parent's at the fork)."""
    global _OPENING
    _OPENING = threading.Lock()


_OPENING = threading.Lock()
os.register_at_fork(after_in_child=_new_opening_lock)


class LmdbDataset(Dataset):
    """Reads one split; the environment opens lazily in each process (safe across fork)."""

    format = NAME

    def __init__(self, path: Path, manifest: Manifest, split: str) -> None:
        super().__init__(path, split=split, classes=manifest.classes, size=manifest.split(split).samples)
        self._path = str(Path(path).resolve())
        self.identity = Identity.take(self._path, Path(self._path) / DATA_FILE, manifest, read_manifest)
        self.fingerprint = manifest.content_digest(split)
        self.fields = tuple(manifest.split(split).fields)  # each record's fields ride in its JSON (record_meta)

    def _read(self, index: int) -> Record:
        with shared_env(self._path, self.identity).begin(buffers=False) as txn:
            value = txn.get(record_key(self.split, index))
        if value is None:
            raise KeyError(f"{self.path}: record {index} of split {self.split!r} is missing; run `datapipe verify`")
        return unpack_record(value)


class LmdbWriter(Writer):
    """Batches puts into large transactions; grows the map (and re-puts the batch) when it fills."""

    def __init__(self, staging: Path, *, size_hint: int, shard_bytes: int) -> None:
        super().__init__(staging, size_hint=size_hint, shard_bytes=shard_bytes)
        # meminit (LMDB's default) zeroes a page's unused bytes before it is written: without it they
        # held whatever the converting process's heap held (other datasets' images, a store's
        # credentials) and went out with the dataset (py-lmdb's docs warn of exactly this)
        self._env = lmdb.open(str(self.staging), map_size=max(_MIN_MAP, int(size_hint * 1.2) + _MIN_MAP),
                              subdir=True, meminit=True, max_dbs=0)
        self._pending: list[tuple[bytes, bytes]] = []
        self._pending_bytes = 0

    def write(self, split: str, index: int, record: Record) -> None:
        value = pack_record(record)
        self._pending.append((record_key(split, index), value))
        self._pending_bytes += len(value)
        if self._pending_bytes >= _TXN_BYTES:
            with _system_error(self.staging):
                self._commit()

    def _commit(self) -> None:
        while self._pending:
            try:
                with self._env.begin(write=True) as txn:
                    for key, value in self._pending:
                        txn.put(key, value)
            except lmdb.MapFullError:
                # The failed transaction was aborted whole: grow outside any transaction, put it all again.
                self._env.set_mapsize(self._env.info()["map_size"] * 2)
                continue
            self._pending, self._pending_bytes = [], 0

    def checkpoint(self) -> dict[str, Any]:
        with _system_error(self.staging):
            self._commit()
            self._env.sync(True)
        return {}

    def restore(self, state: dict[str, Any], counts: dict[str, int]) -> None:
        with self._env.begin(write=True) as txn:
            for split in {k.split(b"/", 1)[0].decode() for k in _split_heads(txn)}:
                cursor = txn.cursor()
                prefix = f"{split}/".encode()
                if cursor.set_range(record_key(split, counts.get(split, 0))):
                    while cursor.key().startswith(prefix) and cursor.delete():
                        pass

    def close(self, manifest: Manifest) -> None:
        self.checkpoint()
        self._env.close()
        write_dir_manifest(self.staging, manifest)

    def abort(self) -> None:
        self._env.close()


@contextlib.contextmanager
def _system_error(where: Path) -> Iterator[None]:
    """LMDB's write failures (a full disk, an I/O error) as the OSError they are, naming the folder, so
    the converter stops in one line and keeps the finished part for --resume."""
    try:
        yield
    except lmdb.MapFullError:
        raise
    except lmdb.Error as exc:
        raise OSError(f"LMDB could not write {where}: {exc}") from None


def _split_heads(txn: lmdb.Transaction) -> list[bytes]:
    """The first key of each split present (one seek per split, not a full scan)."""
    heads, cursor = [], txn.cursor()
    found = cursor.first()
    while found:
        key = cursor.key()
        heads.append(key)
        found = cursor.set_range(key.split(b"/", 1)[0] + b"0")  # "0" sorts right after "/"
    return heads


read_manifest = read_dir_manifest
