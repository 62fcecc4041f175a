"""What DALI's parallel external_source runs in its worker processes: the epoch order's batches, read
through datapipe.formats, with each sample's plan (view geometry, interpolation, pixel ops: the
planner's draws, datapipe.augment.plan) and the on_error policy applied.

One pipeline serves every epoch. The loader tells the workers which epoch, global position and image
size each DALI epoch reads through an `EpochTable`, a small shared file written before the DALI epoch is
started (DALI schedules an epoch's first batches when it is reset, so the row is always there in
time). The callable pickles without open handles (spawned workers need that); each worker opens the
store once, lazily. A worker forks nothing, so the first call in a process other than the one that
made the source marks that process as one that calls the object store directly
(datapipe.storage.isolate); a call in the maker's process (the loader's own checks, a test) does not.
"""
from __future__ import annotations

import io
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ...augment import plan as planner
from ...augment.dali import INTERP_CODES, slot_matrices
from ...augment.plan import SamplePlan
from ...augment.recipe import Recipe
from ...augment.slots import OpBounds, merged_bounds, op_bounds, ops_row, placed_chains, placed_ops
from ...formats.base import Dataset
from ...image.geometry import ViewGeometry, view_of
from ...image.headers import BadImageError, image_ext, jpeg_scan_start, png_has_transparency
from ...image.layout import image_dims
from ...mix.dataset import recipe_lookup, recipes_of
from ...order.sharding import EpochOrder, READ_AHEAD_SHARDS, ShardOrder, record_of
from ...storage.isolate import forks_nothing, may_fork_workers
from ..bad_samples import serve_or_substitute
from ..deaths import shield_worker
from ..fields import FieldSpec
from .wire import Wire

RING = 16  # rows of the table; only the DALI epoch being drained and the next one are ever live
COLUMNS = 4  # epoch, DALI epoch written for, batch limit, image size
NO_LIMIT = np.iinfo(np.int64).max
PNG_END = b"IEND\xaeB`\x82"


class EpochTable:
    """DALI epoch number -> (epoch, batch limit, image size) in a file every worker maps, and the
    epoch's position (the order's JSON form) in a small file beside it, written before the row. The
    size row is how progressive resizing reaches the workers without a new pipeline (0: the
    settings' size)."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self._rows: np.memmap | None = None
        self._pid: int | None = None

    @classmethod
    def create(cls, folder: Path) -> "EpochTable":
        table = cls(Path(folder) / "epochs.i64")
        np.memmap(table.path, dtype=np.int64, mode="w+", shape=(RING, COLUMNS)).flush()
        return table

    def _map(self) -> np.memmap:
        if self._pid != os.getpid():
            self._rows, self._pid = np.memmap(self.path, dtype=np.int64, mode="r+", shape=(RING, COLUMNS)), os.getpid()
        return self._rows  # type: ignore[return-value]

    def write(self, dali_epoch: int, epoch: int, position: Any, limit: int = NO_LIMIT, *, size: int = 0) -> None:
        file = Path(self.path).with_name(f"position-{dali_epoch % RING}.json")
        file.write_text(json.dumps(position))
        self._map()[dali_epoch % RING] = (epoch, dali_epoch, limit, size)

    def stop(self, dali_epoch: int) -> None:
        """No further batch of this DALI epoch: its workers answer StopIteration from now on."""
        self._map()[dali_epoch % RING, 2] = 0

    def read(self, dali_epoch: int) -> tuple[int, int, int, int]:
        """(epoch, the DALI epoch its row was written for, batch limit, image size or 0)."""
        epoch, written, limit, size = (int(v) for v in self._map()[dali_epoch % RING])
        return epoch, written, limit, size

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


def gpu_decodable(data: bytes) -> bytes:
    """The bytes DALI's mixed (GPU) decoder gets. A PNG with a tRNS chunk (palette or colour-key
    transparency) decodes to a white image there (DALI 2.4, nvImageCodec 0.9, H100: 126 levels off
    the CPU decode, measured by tools/dali_decode_probe.py; DALI's CPU decoder is right): such a
    record goes as an RGB PNG of its pixels by the one rule (decode.to_rgb: upright, alpha dropped),
    which every decoder reads alike. Rare (scrapes' palette PNGs), and only those pay a CPU encode."""
    if image_ext(data) != "png" or not png_has_transparency(data):
        return data
    from PIL import Image  # here only: a source worker loads Pillow for such a record alone

    from ...image.decode import decode_rgb

    out = io.BytesIO()  # from the bare pixels: Pillow keeps a colour key (tRNS) on an RGB image it converted
    Image.fromarray(np.asarray(decode_rgb(data))).save(out, format="PNG", compress_level=1)
    return out.getvalue()


@dataclass(frozen=True)
class ViewSettings:
    image_size: int  # the size of a DALI epoch whose table row names none
    train: bool
    seed: int
    skip_errors: bool
    check_files: bool  # the source was not validated by `datapipe convert` (Dataset.validated)
    recipe: Recipe | None = None  # the augmentation (datapipe.augment); None: the default recipe
    gpu_decode: bool = False  # the graph decodes on the GPU (mixed): awkward bytes go through gpu_decodable


Prepared = tuple[np.ndarray, int, dict[str, np.ndarray]]  # encoded bytes, label, the view's and ops' columns


def padded(blobs: list[bytes]) -> list[dict[str, np.ndarray]]:
    """A batch's field columns (wire.FIELDS), per sample: each blob zero-padded to the longest (DALI's
    PyTorch iterator makes one tensor of a batch's samples: their shapes must agree), and its length."""
    width = max(len(b) for b in blobs)
    return [{"fields": np.frombuffer(b.ljust(width, b"\0"), dtype=np.uint8), "fields_len": len(b)} for b in blobs]


def view_columns(geometry: ViewGeometry, size: int) -> dict[str, Any]:
    """One sample's view columns (wire.VIEW)."""
    return {"roi_anchor": geometry.roi[:2], "roi_shape": geometry.roi[2:], "resized": geometry.resized,
            "window": geometry.window, "window_shape": (size, size), "flip": int(geometry.flip),
            "interpolation": INTERP_CODES[geometry.interpolation]}


def op_columns(plan: SamplePlan, bounds: OpBounds) -> dict[str, Any]:
    """One sample's op columns (wire.OPS, wire.mix_columns): its ops at their slots (slots.placed_ops)
    as a row and their affine matrices; AugMix's chains the same way, its weights and blend factor."""
    placed = placed_ops(plan, bounds)
    columns = {"ops": ops_row(placed), "matrices": slot_matrices(placed, plan.size)}
    if bounds.chains:
        chains = placed_chains(plan.augmix, bounds)
        columns.update(mix_ops=ops_row(chains), mix_matrices=slot_matrices(chains, plan.size),
                       mix_weights=plan.augmix.weights, mix_m=plan.augmix.m)
    return columns


class PlannedSource:
    """BatchInfo -> one batch of the epoch order as the columns of its `wire` (wire.py): encoded images,
    labels, record indices, the views, the ops where the graph applies them, the record each sample
    replaced (-1 for none), the extra fields where asked for. The image size of each DALI epoch comes
    from its table row (progressive resizing), else from the settings."""

    def __init__(self, dataset: Dataset, order: EpochOrder | ShardOrder, table: EpochTable, settings: ViewSettings,
                 fields: FieldSpec | None = None) -> None:
        self.dataset, self.order, self.table, self.settings, self.fields = dataset, order, table, settings, fields
        bounds = merged_bounds([op_bounds(r) for r in recipes_of(dataset, settings.recipe or Recipe())])
        self.bounds = bounds if settings.train and bounds.applies else None  # None: the graph applies no op
        self.recipe_of = recipe_lookup(dataset)  # a mix's per-source recipes, else None
        self.wire = Wire.of(self.bounds, fields=fields is not None)
        self._maker_pid = os.getpid()  # kept through pickling: a spawned worker compares its own with it
        self._cached: tuple[tuple[int, int], Sequence[np.ndarray]] | None = None
        self._ahead: Sequence[tuple[int, ...]] | None = None  # per batch, computed when asked for

    def _batches(self, epoch: int, dali_epoch: int) -> Sequence[np.ndarray]:
        """The order's batches for this DALI epoch (each computed when asked for), kept for its next calls."""
        if self._cached is None or self._cached[0] != (epoch, dali_epoch):
            position = self.order.adopt(self.table.position(dali_epoch))
            batches = self.order.batches(epoch, position)
            remote = self.dataset.location.remote and isinstance(self.order, ShardOrder)
            self._ahead = self.order.shards_ahead(batches, READ_AHEAD_SHARDS) if remote else None
            self._cached = ((epoch, dali_epoch), batches)
        return self._cached[1]

    def prepare(self, epoch: int, index: int, size: int | None = None, key: int | None = None) -> Prepared:
        """Record `index`'s encoded bytes, label and view columns, its planned ops with them where the
        graph applies ops: one plan (planner.plan_sample) keyed by `key`, the record or its repeat's key
        under repeated augmentation (sharding.EpochKeys)."""
        data, label, view, plan, _ = self._read(epoch, index, size or self.settings.image_size, key)
        return data, label, {**view, **self._ops(plan)}

    def _read(self, epoch: int, index: int, size: int, key: int | None) -> tuple[np.ndarray, int, tuple,
                                                                               SamplePlan, Any]:
        """The part a bad record can fail (read, structure check, header, the one planner call, the
        view), the plan, and the record's stored fields when asked for; raises for a record that cannot be used."""
        sample = self.dataset[index] if self.fields is None else self.dataset.record(index)
        s = self.settings
        if s.check_files:
            check_structure(sample.data)
        width, height = image_dims(sample.data)
        recipe = s.recipe if self.recipe_of is None else self.recipe_of(index, s.recipe or Recipe())
        plan = planner.plan_sample(recipe, s.seed, epoch, index if key is None else key, size, width, height,
                                   train=s.train)
        data = gpu_decodable(sample.data) if s.gpu_decode else sample.data
        return (np.frombuffer(data, dtype=np.uint8), sample.label, view_columns(view_of(plan, width, height), size),
                plan, None if self.fields is None else sample.fields)

    def _ops(self, plan: SamplePlan) -> dict[str, Any]:
        """The planned ops' columns; none where the graph applies no ops. Outside the bad-record
        policy: an error here is a bug, never served around."""
        return op_columns(plan, self.bounds) if self.bounds is not None else {}

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
            shield_worker()
        epoch, written, limit, size = self.table.read(batch_info.epoch_idx)
        batches = self._batches(epoch, written)
        if batch_info.iteration >= min(limit, len(batches)):
            raise StopIteration
        if self._ahead:
            self.dataset.read_ahead(list(self._ahead[batch_info.iteration]))
        samples: list[dict[str, Any]] = []
        blobs: list[bytes] = []
        for key in batches[batch_info.iteration]:
            index = record_of(int(key), len(self.dataset))
            (data, label, view, plan, stored), served, bad = serve_or_substitute(
                lambda i: self._read(epoch, i, size, int(key) if i == index else i), self.dataset, index,
                seed=self.settings.seed, epoch=epoch, skip=self.settings.skip_errors)
            samples.append({"data": data, "label": label, "index": served, **view, **self._ops(plan),
                            "replaced": -1 if bad is None else bad.index})
            if self.fields is not None:  # the served record's (a substitute's for a bad one), tokenized here
                blobs.append(self.fields.to_wire(self.fields.values(stored)))
        batch = self.wire.empty()
        for values, fields in zip(samples, padded(blobs) if self.fields is not None else [{}] * len(samples)):
            self.wire.add(batch, {**values, **fields})
        return self.wire.send(batch)
