"""Where a sharded conversion puts finished shards: a local staging folder or an object-store folder.

A shard is built in a scratch folder of its own, then committed: its `.tar` and `.idx`, and its
record list last. A record list that exists therefore means a whole shard, on any target, and a
retried or resumed task simply builds and commits the same files again.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

from datapipe.formats.base import write_atomic
from datapipe.storage import RemoteStore

LIST_SUFFIX = ".records.json"
SCRATCH_PREFIX = ".building-"


class FolderTarget:
    """Shards go into a local folder (the staging folder of a local destination, or a folder every
    node mounts); commits are renames within it."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)

    def describe(self, name: str = "") -> str:
        return str(self.folder / name)

    @contextlib.contextmanager
    def scratch(self, shard: str) -> Iterator[Path]:
        """A fresh folder beside the output (same filesystem: commits are renames), removed after."""
        folder = self.folder / f"{SCRATCH_PREFIX}{shard}-{socket.gethostname()}-{os.getpid()}"  # nodes share it
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir()  # not parents: a task must not bring back an output the driver removed
        try:
            yield folder
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def commit(self, files: list[Path], record_list: str, text: str) -> None:
        for file in files:
            os.replace(file, self.folder / file.name)
        write_atomic(self.folder / record_list, text.encode("utf-8"))

    def listing(self) -> dict[str, int]:
        """name -> size of every file in the target."""
        return {p.name: p.stat().st_size for p in self.folder.iterdir() if p.is_file()} if self.folder.is_dir() else {}

    def read_text(self, name: str) -> str:
        return (self.folder / name).read_text(encoding="utf-8")

    def put(self, name: str, blob: bytes) -> None:
        write_atomic(self.folder / name, blob)

    def delete(self, name: str) -> None:
        (self.folder / name).unlink(missing_ok=True)

    def clear_scratch(self) -> None:
        """Remove scratch folders a killed task left behind."""
        for leftover in self.folder.glob(f"{SCRATCH_PREFIX}*"):
            shutil.rmtree(leftover, ignore_errors=True)


class StoreTarget:
    """Shards go into an object-store folder: built in a local temporary folder, uploaded, removed."""

    def __init__(self, url: str) -> None:
        self.store = RemoteStore(url)

    def describe(self, name: str = "") -> str:
        return self.store.describe(name)

    @contextlib.contextmanager
    def scratch(self, shard: str) -> Iterator[Path]:
        with tempfile.TemporaryDirectory(prefix=f"datapipe-{shard}-") as folder:
            yield Path(folder)

    def commit(self, files: list[Path], record_list: str, text: str) -> None:
        for file in files:
            self.store.upload(file.name, file)
        self.store.upload(record_list, text.encode("utf-8"))

    def listing(self) -> dict[str, int]:
        return self.store.list()

    def read_text(self, name: str) -> str:
        return self.store.read(name).decode("utf-8")

    def put(self, name: str, blob: bytes) -> None:
        self.store.upload(name, blob)

    def delete(self, name: str) -> None:
        self.store.delete(name)

    def clear_scratch(self) -> None:
        """Nothing to do: scratch folders are temporary directories of the task's machine."""


Target = FolderTarget | StoreTarget
