"""What DALI's parallel external_source runs in its worker processes: the plan's batches, read
through datapipe.formats, with each sample's view geometry and the on_error policy applied.

One pipeline serves every epoch. The loader tells the workers which epoch and global position each
DALI epoch reads through an `EpochTable`, a small shared file written before the DALI epoch is
started (DALI schedules an epoch's first batches when it is reset, so the row is always there in
time). The callable pickles without open handles (spawned workers need that); each worker opens the
store once, lazily. A worker forks nothing, so the first call in a process other than the one that
made the source marks that process as one that calls the object store directly
(datapipe.storage.isolate); a call in the maker's process (the loader's own checks, a test) does not.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ...formats.base import Dataset
from ...geometry import sample_rng
from ...headers import BadImageError, image_ext, jpeg_scan_start
from ...layout import view_geometry
from ...sharding import EpochPlan, READ_AHEAD_SHARDS, ShardPlan
from ...storage.isolate import forks_nothing, may_fork_workers
from ..bad_samples import serve_or_substitute

RING = 16  # rows of the table; only the DALI epoch being drained and the next one are ever live
NO_LIMIT = np.iinfo(np.int64).max
PNG_END = b"IEND\xaeB`\x82"


class EpochTable:
    """DALI epoch number -> (epoch, batch limit) in a file every worker maps, and the epoch's position
    (the plan's JSON form) in a small file beside it, written before the row."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self._rows: np.memmap | None = None
        self._pid: int | None = None

    @classmethod
    def create(cls, folder: Path) -> "EpochTable":
        table = cls(Path(folder) / "epochs.i64")
        np.memmap(table.path, dtype=np.int64, mode="w+", shape=(RING, 3)).flush()
        return table

    def _map(self) -> np.memmap:
        if self._pid != os.getpid():
            self._rows, self._pid = np.memmap(self.path, dtype=np.int64, mode="r+", shape=(RING, 3)), os.getpid()
        return self._rows  # type: ignore[return-value]

    def write(self, dali_epoch: int, epoch: int, position: Any, limit: int = NO_LIMIT) -> None:
        file = Path(self.path).with_name(f"position-{dali_epoch % RING}.json")
        file.write_text(json.dumps(position))
        self._map()[dali_epoch % RING] = (epoch, dali_epoch, limit)

    def stop(self, dali_epoch: int) -> None:
        """No further batch of this DALI epoch: its workers answer StopIteration from now on."""
        self._map()[dali_epoch % RING, 2] = 0

    def read(self, dali_epoch: int) -> tuple[int, int, int]:
        """(epoch, the DALI epoch its row was written for, batch limit)."""
        epoch, written, limit = (int(v) for v in self._map()[dali_epoch % RING])
        return epoch, written, limit

    def position(self, dali_epoch: int) -> Any:
        return json.loads(Path(self.path).with_name(f"position-{dali_epoch % RING}.json").read_text())

    def __getstate__(self) -> dict:
        return {"path": self.path, "_rows": None, "_pid": None}


def check_structure(data: bytes) -> None:
    """What an unconverted file must pass before DALI sees it (DALI cannot skip a sample): a JPEG
    has a scan and its end marker, a PNG its IEND chunk. Cheap: no decode."""
    ext = image_ext(data)
    if ext == "jpg":
        start = jpeg_scan_start(data)
        if start < 0 or data.rfind(b"\xff\xd9") < start:
            raise BadImageError("corrupt or truncated: JPEG without a scan or its end-of-image marker")
    elif ext == "png" and not data.rstrip(b"\0").endswith(PNG_END):
        raise BadImageError("corrupt or truncated: PNG without its IEND chunk")


@dataclass(frozen=True)
class ViewSettings:
    image_size: int
    train: bool
    seed: int
    skip_errors: bool
    check_files: bool  # the source was not validated by `datapipe convert` (Dataset.validated)


Prepared = tuple[np.ndarray, int, np.ndarray]  # encoded bytes, label, geometry row


OUTPUTS = 9


class PlannedSource:
    """BatchInfo -> one batch of the plan as 9 outputs: encoded images, labels, record indices, ROI
    anchor (left, top) and shape (width, height), resized (width, height), window anchor (left,
    top), flip, and the record each sample replaced (-1 for none)."""

    def __init__(self, dataset: Dataset, plan: EpochPlan | ShardPlan, table: EpochTable, settings: ViewSettings) -> None:
        self.dataset, self.plan, self.table, self.settings = dataset, plan, table, settings
        self._maker_pid = os.getpid()  # kept through pickling: a spawned worker compares its own with it
        self._cached: tuple[tuple[int, int], list[np.ndarray]] | None = None
        self._ahead: list[tuple[int, ...]] | None = None

    def _batches(self, epoch: int, dali_epoch: int) -> list[np.ndarray]:
        if self._cached is None or self._cached[0] != (epoch, dali_epoch):
            position = self.plan.decode(self.table.position(dali_epoch))
            batches = self.plan.batches(epoch, position)
            remote = self.dataset.location.remote and isinstance(self.plan, ShardPlan)
            self._ahead = self.plan.shards_ahead(batches, READ_AHEAD_SHARDS) if remote else None
            self._cached = ((epoch, dali_epoch), batches)
        return self._cached[1]

    def prepare(self, epoch: int, index: int) -> Prepared:
        """Read record `index` and compute its view; raises for a record that cannot be used."""
        sample = self.dataset[index]
        if self.settings.check_files:
            check_structure(sample.data)
        s = self.settings
        g = view_geometry(sample.data, s.image_size, train=s.train, rng=sample_rng(s.seed, epoch, index))
        row = np.array([*g.roi, *g.resized, *g.window, int(g.flip)], dtype=np.float32)
        return np.frombuffer(sample.data, dtype=np.uint8), sample.label, row

    def problem(self, epoch: int, index: int) -> str | None:
        """Why record `index` cannot be used, or None (the parent uses this to report a skip)."""
        try:
            self.prepare(epoch, index)
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"
        return None

    def __call__(self, batch_info) -> tuple[list[np.ndarray], ...]:
        if os.getpid() != self._maker_pid and may_fork_workers():  # first call in a DALI worker
            forks_nothing()
        epoch, written, limit = self.table.read(batch_info.epoch_idx)
        batches = self._batches(epoch, written)
        if batch_info.iteration >= min(limit, len(batches)):
            raise StopIteration
        if self._ahead:
            self.dataset.read_ahead(list(self._ahead[batch_info.iteration]))
        columns: tuple[list[np.ndarray], ...] = tuple([] for _ in range(OUTPUTS))
        for index in batches[batch_info.iteration]:
            (data, label, g), served, bad = serve_or_substitute(
                lambda i: self.prepare(epoch, i), self.dataset, int(index), seed=self.settings.seed, epoch=epoch,
                skip=self.settings.skip_errors)
            values = (data, np.array(label, np.int64), np.array(served, np.int64), g[0:2], g[2:4], g[4:6], g[6:8],
                      np.array(g[8], np.int32), np.array(-1 if bad is None else bad.index, np.int64))
            for column, value in zip(columns, values):
                column.append(value)
        return columns
