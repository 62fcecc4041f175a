"""What DALI's source sends its graph, described once: each column's name, dtype and per-sample shape.

The source (source.PlannedSource) fills a batch by these names, each value checked against its
column; the graph (graph.py) declares the external source's outputs and their DALI types from the
same Wire and reads its nodes by name. Which columns travel follows from the op bounds of the
graph (none: no ops; AugMix's chains: their columns too) and whether fields beyond image and label
are asked for.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...augment.slots import MAX_OPS, OpBounds


@dataclass(frozen=True)
class Column:
    """One per-sample output: its NumPy dtype and shape (None: a length that varies per sample)."""

    name: str
    dtype: str
    shape: tuple[int, ...] | None = ()


RECORD = (Column("data", "uint8", None), Column("label", "int64"), Column("index", "int64"))
# the view (geometry.view_of): ROI anchor (left, top) and shape (width, height), resized (width, height),
# window anchor (left, top) and shape (size, size: the size may change per epoch), flip, interpolation
# (0 bilinear, 1 bicubic: augment.dali.INTERP_CODES)
VIEW = (Column("roi_anchor", "float32", (2,)), Column("roi_shape", "float32", (2,)), Column("resized", "float32", (2,)),
        Column("window", "float32", (2,)), Column("window_shape", "float32", (2,)), Column("flip", "int32"),
        Column("interpolation", "int32"))
# the plan's placed ops (slots.placed_ops as slots.ops_row: kind id, parameter per slot) and each slot's
# affine matrix
OPS = (Column("ops", "float32", (2 * MAX_OPS,)), Column("matrices", "float32", (MAX_OPS, 2, 3)))
REPLACED = (Column("replaced", "int64"),)  # the record a substitute replaced (-1: none)


def mix_columns(bounds: OpBounds) -> tuple[Column, ...]:
    """AugMix's: the chains' placed ops (slots.placed_chains), their matrices, the weights, the blend."""
    slots = bounds.chains * bounds.depth
    return (Column("mix_ops", "float32", (2 * max(MAX_OPS, slots),)),
            Column("mix_matrices", "float32", (max(MAX_OPS, slots), 2, 3)),
            Column("mix_weights", "float32", (bounds.chains,)), Column("mix_m", "float32"))


# the served record's extra fields (fields.FieldSpec.to_wire: UTF-8 JSON, zero-padded to the batch's
# longest, as DALI's PyTorch iterator makes one tensor of a batch) and that JSON's length
FIELDS = (Column("fields", "uint8", None), Column("fields_len", "int64"))


@dataclass(frozen=True)
class Wire:
    """The columns one source sends, in order."""

    columns: tuple[Column, ...]

    @classmethod
    def of(cls, bounds: OpBounds | None, *, fields: bool) -> "Wire":
        """The columns for a graph applying ops within `bounds` (None: no ops), with fields or not."""
        ops = OPS + (mix_columns(bounds) if bounds.chains else ()) if bounds is not None else ()
        return cls(RECORD + VIEW + ops + REPLACED + (FIELDS if fields else ()))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    def carries(self, name: str) -> bool:
        return any(c.name == name for c in self.columns)

    def empty(self) -> dict[str, list[np.ndarray]]:
        """A batch to fill: one list per column."""
        return {c.name: [] for c in self.columns}

    def add(self, batch: dict[str, list[np.ndarray]], values: dict[str, object]) -> None:
        """One sample's values appended to `batch`, each as its column's dtype and checked against its
        shape; a value the wire does not carry, or one missing, is a bug: ValueError naming it."""
        if values.keys() != batch.keys():
            raise ValueError(f"a sample must give the wire's columns {self.names}, got {tuple(values)}")
        for column in self.columns:
            value = np.asarray(values[column.name], dtype=column.dtype)
            if column.shape is not None and value.shape != column.shape:
                raise ValueError(f"column {column.name!r} takes shape {column.shape}, got {value.shape}")
            batch[column.name].append(value)

    def send(self, batch: dict[str, list[np.ndarray]]) -> tuple[list[np.ndarray], ...]:
        """The batch as the external source returns it: the columns in the wire's order."""
        return tuple(batch[name] for name in self.names)

    def dali_types(self) -> list:
        """Each column's DALI type, in order (for fn.external_source's dtype)."""
        from nvidia.dali import types

        table = {"uint8": types.UINT8, "int32": types.INT32, "int64": types.INT64, "float32": types.FLOAT}
        return [table[c.dtype] for c in self.columns]
