"""The fields a batch carries beside its images (make_loader's `fields=`): which ones a dataset can
give, what each sample takes from the record it was served (its caption, tokenized where the sample
is decoded: a worker process, a decode thread, a DALI source worker; its JSON metadata; its
multi-label targets), how a batch's column is made of them, and the batch classes.

A batch's attribute for a field is the field's name + "s", in the order asked for, then `indices`:
fields=("image", "text") yields (images, texts, indices). The default ("image", "label") yields the
loader's `Batch` itself. Other batches are named tuples made once per field tuple and registered
under this module's names, so they pickle into any process (Lightning and Accelerate move batches;
a process that has not made the class yet makes it while unpickling: `__getattr__` below).
"""
from __future__ import annotations

import json
import pickle
from collections import namedtuple
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..errors import OwnLineError, first_line, summary
from ..records import Fields

FIELD_CHOICES = ("image", "label", "text", "meta", "multilabel", "source")
DEFAULT_FIELDS = ("image", "label")
# a field beyond image and label -> the records.FIELD_NAMES entry a dataset must carry for it
STORED = {"text": "text", "meta": "meta", "multilabel": "labels"}
CLASS_PREFIX = "Batch_"


def check_fields(fields: Any) -> tuple[str, ...]:
    """`fields` as a tuple of known names, "image" first, each once; else a one-line ValueError."""
    if not isinstance(fields, (tuple, list)) or not all(isinstance(f, str) for f in fields):
        raise ValueError(f"fields must be a tuple of names from {FIELD_CHOICES}, e.g. ('image', 'text'), "
                         f"got {fields!r}")
    fields = tuple(fields)
    unknown = [f for f in fields if f not in FIELD_CHOICES]
    if unknown:
        raise ValueError(f"unknown field {unknown[0]!r} in fields={fields}: choose from {FIELD_CHOICES}")
    if not fields or fields[0] != "image" or len(set(fields)) != len(fields):
        raise ValueError(f"fields must start with 'image' and name each field once, e.g. ('image', 'text'), "
                         f"got {fields}")
    return fields


def batch_class(fields: tuple[str, ...]) -> type:
    """The named tuple (FIELD + "s" for each field, then `indices`) batches of `fields` are, made once."""
    fields = check_fields(fields)
    name = CLASS_PREFIX + "_".join(fields)
    cls = globals().get(name)
    if cls is None:
        cls = namedtuple(name, [f + "s" for f in fields] + ["indices"], module=__name__)
        cls.__doc__ = (f"A batch of fields {fields}: images as Batch's; labels int64 (or soft targets); texts a list "
                       "of str, or token ids (N x L LongTensor, or a list of 1-D ones when lengths differ); metas a "
                       "list of dict; multilabels N x classes float32 multi-hot; sources int64 (a Mix's source "
                       "numbers, into mix.names); indices int64 record indices (host; a Mix's: inside their source)")
        globals()[name] = cls
    return cls


def __getattr__(name: str) -> Any:
    """A batch class asked for by name before this process made it (unpickling a batch)."""
    if name.startswith(CLASS_PREFIX):
        try:
            return batch_class(tuple(name[len(CLASS_PREFIX):].split("_")))
        except ValueError:
            pass
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class TokenizerFailed(OwnLineError, ValueError):
    """The tokenizer= raised on a caption, or returned what is not one caption's token ids: an error of
    the loader's configuration, never a bad record (no backend serves around it)."""


def token_ids(out: Any) -> np.ndarray:
    """A tokenizer's output for one caption as 1-D int64 ids: a tensor, array or list of ids; a
    leading 1 squeezed (open_clip returns 1 x 77 for one string); a Hugging Face encoding's input_ids."""
    if isinstance(out, Mapping):
        out = out["input_ids"]
    ids = np.asarray(out.cpu() if isinstance(out, torch.Tensor) else out)
    if ids.ndim == 2 and ids.shape[0] == 1:
        ids = ids[0]
    if ids.ndim != 1 or not (ids.size == 0 or np.issubdtype(ids.dtype, np.integer)):
        raise ValueError(f"tokenizer= must return one caption's token ids (1-D integers, or 1 x L), got "
                         f"{type(out).__name__} of shape {ids.shape} and dtype {ids.dtype}")
    return ids.astype(np.int64, copy=False)


def check_picklable(tokenizer: Any, where: str) -> None:
    """A one-line ValueError when `tokenizer` cannot be sent to processes started by spawn."""
    if tokenizer is None:
        return
    try:
        pickle.dumps(tokenizer)
    except Exception as exc:
        raise ValueError(f"tokenizer {tokenizer!r} cannot be pickled for {where}, which start by spawn "
                         f"({type(exc).__name__}: {exc}): give a module-level function or object, or "
                         "start_method='fork'") from None


@dataclass(frozen=True)
class FieldSpec:
    """The fields asked for, the tokenizer and the class count: what workers need to fill them."""

    fields: tuple[str, ...] = DEFAULT_FIELDS
    tokenizer: Any = None
    num_classes: int = 0

    @property
    def extra(self) -> tuple[str, ...]:
        """The fields read from a record's Fields (text, meta, multilabel), in the order asked for."""
        return tuple(f for f in self.fields if f in STORED)

    @property
    def default(self) -> bool:
        return self.fields == DEFAULT_FIELDS

    def values(self, fields: Fields) -> tuple:
        """One served record's values of the extra fields (run in the workers): its caption ("" for
        none) or its token ids (1-D int64 array), its metadata's JSON text, its multi-label ids."""
        out = []
        for name in self.extra:
            if name == "text":
                text = fields.text or ""
                out.append(text if self.tokenizer is None else self.tokens(text))
            elif name == "meta":
                out.append(fields.meta or "{}")
            else:
                out.append(tuple(fields.labels or ()))
        return tuple(out)

    def tokens(self, text: str) -> np.ndarray:
        """The tokenizer's ids for one caption; TokenizerFailed, one line naming it and the caption,
        when it raises or returns something that is not one caption's ids."""
        try:
            return token_ids(self.tokenizer(text))
        except Exception as exc:
            raise TokenizerFailed(f"tokenizer {getattr(self.tokenizer, '__name__', self.tokenizer)!r} failed on the "
                                  f"caption {text[:60]!r}: {type(exc).__name__}: {first_line(exc)}") from None

    def columns(self, rows: list[tuple]) -> dict[str, Any]:
        """A batch's samples' values (from `values`) as one column per extra field, on the host."""
        out: dict[str, Any] = {}
        for k, name in enumerate(self.extra):
            column = [row[k] for row in rows]
            if name == "text":
                out[name] = column if self.tokenizer is None else stack_ids(column)
            elif name == "meta":
                out[name] = [json.loads(m) for m in column]
            else:
                out[name] = multi_hot(column, self.num_classes)
        return out

    def to_wire(self, values: tuple) -> bytes:
        """One sample's values as UTF-8 JSON (DALI's source workers send them through the pipeline)."""
        return json.dumps([v.tolist() if isinstance(v, np.ndarray) else v for v in values],
                          ensure_ascii=False, separators=(",", ":")).encode()

    def from_wire(self, blob: bytes) -> tuple:
        """`to_wire`'s bytes back to one sample's values."""
        decoded = json.loads(blob)
        return tuple(np.asarray(v, np.int64) if name == "text" and self.tokenizer is not None else v
                     for name, v in zip(self.extra, decoded))

    def batch(self, images: torch.Tensor, labels: torch.Tensor, indices: torch.Tensor, columns: dict[str, Any],
              device: torch.device) -> tuple:
        """The batch of these fields: multi-hot targets moved to the device, the rest as they are."""
        have = {"image": images, "label": labels, **columns}
        if "multilabel" in have:
            have["multilabel"] = have["multilabel"].to(device, non_blocking=True)
        return batch_class(self.fields)(*(have[f] for f in self.fields), indices)


def stack_ids(ids: list[np.ndarray]) -> torch.Tensor | list[torch.Tensor]:
    """Captions' token ids: an N x L LongTensor when every caption has L of them, else a list."""
    tensors = [torch.from_numpy(np.ascontiguousarray(a)) for a in ids]
    if tensors and all(len(t) == len(tensors[0]) for t in tensors):
        return torch.stack(tensors)
    return tensors


def multi_hot(ids: list[tuple[int, ...]], num_classes: int) -> torch.Tensor:
    """Multi-label targets as an N x classes float32 multi-hot tensor (an id outside the classes: a
    ValueError; the formats refuse such a record when it is read, so this is a last guard)."""
    out = torch.zeros((len(ids), num_classes), dtype=torch.float32)
    for k, labels in enumerate(ids):
        if any(not 0 <= i < num_classes for i in labels):
            raise ValueError(f"multi-label ids ({summary(list(labels), 'id', show=5)}) of a batch's sample {k} "
                             f"are not all class ids "
                             f"(0..{num_classes - 1})")
        if labels:
            out[k, list(labels)] = 1.0
    return out


def field_spec(fields: tuple[str, ...], tokenizer: Any, dataset, *, recipe, train: bool) -> FieldSpec:
    """The spec for a loader over `dataset`, or a one-line ValueError: a field the dataset does not
    carry, or a recipe whose batch stage acts on a field not asked for."""
    have = ("image", "label") + tuple(f for f, stored in STORED.items() if stored in getattr(dataset, "fields", ()))
    have += ("source",) if hasattr(dataset, "mix") else ()  # a mix's: which source each sample came from
    missing = [f for f in fields if f not in have]
    if missing:
        why = " ('source' is a Mix's field)" if missing[0] == "source" else ""
        raise ValueError(f"{dataset} carries fields {have}, not {missing[0]!r}{why}: ask for fields from those")
    if "multilabel" in fields and not dataset.classes:
        raise ValueError(f"field 'multilabel' needs the dataset's classes (multi-hot N x classes); {dataset} has none")
    if train and recipe.soft_targets and "label" not in fields:
        raise ValueError(f"the recipe's mixup/cutmix/label smoothing make soft targets of 'label', which "
                         f"fields={fields} leaves out: add 'label' to fields, or turn them off (mixup_alpha=0, "
                         "cutmix_alpha=0, label_smoothing=0)")
    if train and recipe.mixes and "multilabel" in fields:
        raise ValueError("mixup/cutmix mix the images but not the 'multilabel' targets: turn them off (mixup_alpha=0, "
                         "cutmix_alpha=0) to load multi-label targets, or leave 'multilabel' out")
    return FieldSpec(fields, tokenizer, len(dataset.classes))
