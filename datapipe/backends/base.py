"""The Loader protocol every backend implements, its options, and the on_error policy."""
from __future__ import annotations

import abc
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

import numpy as np
import torch

from ..devices import rank_device
from ..errors import ExpectedError
from ..formats.base import Dataset
from ..resources import cpus_per_rank
from ..storage import StoreError
from ..sharding import EpochPlan, Shard, ShardPlan
from .deaths import WorkerDied

log = logging.getLogger(__name__)
ON_ERROR = ("skip", "raise")
START_METHODS = ("fork", "spawn", "forkserver")
SAMPLING = ("auto", "global", "shards")  # auto: shard-wise for remote datasets, a global permutation otherwise


class Batch(NamedTuple):
    """images: normalized NCHW on the device; labels: int64 on the device; indices: int64 dataset
    record indices, on the host (they are for bookkeeping, not for the model)."""

    images: torch.Tensor
    labels: torch.Tensor
    indices: torch.Tensor


@dataclass(frozen=True)
class LoaderOptions:
    """What every backend needs to know; validated here once."""

    batch_size: int = 256
    train: bool = True
    image_size: int = 224
    seed: int = 0
    drop_last: bool = False
    num_workers: int | None = None
    prefetch_factor: int = 2
    pin_memory: bool | None = None
    device: str | None = None
    dtype: torch.dtype = torch.float32
    channels_last: bool = False
    on_error: str = "skip"
    max_bad_fraction: float = 0.01
    persistent_workers: bool = True
    start_method: str | None = None
    sampling: str = "auto"
    cache_dir: str | None = None
    cache_limit: int | None = None
    mix_shards: int | None = None  # shard-wise sampling's block (ShardPlan); None: 16, 1 for datapipe's own shards

    def __post_init__(self) -> None:
        if self.mix_shards is not None and (not isinstance(self.mix_shards, int) or self.mix_shards < 1):
            raise ValueError(f"mix_shards must be an int >= 1 (1: shard by shard) or None, got {self.mix_shards!r}")
        if self.sampling not in SAMPLING:
            raise ValueError(f"sampling must be one of {SAMPLING}, got {self.sampling!r}")
        if self.cache_limit is not None and self.cache_limit <= 0:
            raise ValueError(f"cache_limit must be a positive number of bytes, got {self.cache_limit}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.image_size < 8:
            raise ValueError(f"image_size must be at least 8 pixels, got {self.image_size}")
        if self.num_workers is not None and self.num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {self.num_workers}")
        if self.prefetch_factor < 1:
            raise ValueError(f"prefetch_factor must be >= 1, got {self.prefetch_factor}")
        if self.on_error not in ON_ERROR:
            raise ValueError(f"on_error must be one of {ON_ERROR}, got {self.on_error!r}")
        if self.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise ValueError(f"dtype must be torch.float32, float16 or bfloat16, got {self.dtype}")
        if not 0 <= self.max_bad_fraction <= 1:
            raise ValueError(f"max_bad_fraction must be within 0..1, got {self.max_bad_fraction}")
        if self.start_method is not None and self.start_method not in START_METHODS:
            raise ValueError(f"start_method must be one of {START_METHODS} or None, got {self.start_method!r}")

    @property
    def workers(self) -> int:
        """num_workers, or this rank's share of the node's CPUs (datapipe.resources)."""
        return cpus_per_rank() if self.num_workers is None else self.num_workers

    @property
    def torch_device(self) -> torch.device:
        """The device batches go to; on CUDA always with this rank's index (datapipe.devices)."""
        return rank_device(self.device)

    @property
    def pinned(self) -> bool:
        """pin_memory, or True when batches go to a CUDA device."""
        return self.pin_memory if self.pin_memory is not None else self.torch_device.type == "cuda"


class BadSample(NamedTuple):
    """A record that could not be read or decoded, and the record served in its place."""

    index: int
    path: str
    reason: str
    substitute: int = -1


class TooManyBadSamples(ExpectedError, RuntimeError):
    """More records of an epoch failed than max_bad_fraction allows: the data, not one file, is broken."""


SUBSTITUTE_TRIES = 8


def record_path(dataset: Dataset, index: int) -> str:
    """A record's original path for an error message, or its number when even that cannot be read."""
    try:
        return dataset.origin(index) or f"record {index}"
    except Exception:  # the store itself is damaged: the number is all there is
        return f"record {index}"


def substitutes(index: int, size: int, *, seed: int, epoch: int) -> Iterator[int]:
    """Records to serve in place of a bad one, in a fixed order: a batch keeps its size (so ranks
    keep equal batch counts and resume positions stay exact) and the choice is reproducible."""
    rng = np.random.default_rng([seed, epoch, index, 7])
    for _ in range(SUBSTITUTE_TRIES):
        candidate = int(rng.integers(size))
        if candidate != index:
            yield candidate


T = TypeVar("T")


def serve_or_substitute(prepare: Callable[[int], T], dataset: Dataset, index: int, *, seed: int, epoch: int,
                        skip: bool) -> tuple[T, int, BadSample | None]:
    """The on_error policy for one record, shared by every backend: (prepare(index), index, None);
    or, when it fails, raise naming the record (skip=False) or serve a substitute and say so."""
    try:
        return prepare(index), index, None
    except StoreError:  # the store failed, not this record: substituting would hide it
        raise
    except Exception as exc:  # stores and decoders raise many types for bad records; which record is what matters
        path = record_path(dataset, index)
        if not skip:
            raise RuntimeError(f"cannot read or decode record {index} ({path}): {type(exc).__name__}: {exc}") from exc
        reason = f"{type(exc).__name__}: {exc}"
    for other in substitutes(index, len(dataset), seed=seed, epoch=epoch):
        try:
            return prepare(other), other, BadSample(index, path, reason, other)
        except Exception:
            continue
    raise RuntimeError(f"record {index} ({path}) is bad ({reason}) and so were the records tried in its place: "
                       "the dataset looks broken; run `datapipe verify` on it")


class EpochSetter:
    """`loader.sampler.set_epoch(e)`, the same as `loader.set_epoch(e)`: where PyTorch Lightning
    sets the epoch of a loader that is not a DataLoader, and where scripts written for a DataLoader
    with a DistributedSampler do."""

    def __init__(self, loader: "Loader") -> None:
        self.set_epoch = loader.set_epoch


class Loader(abc.ABC):
    """`for images, labels, indices in loader`; `set_epoch`, `len`, `state_dict`, `load_state_dict`.

    The base class keeps the epoch and the global position in it (samples of the epoch's order that
    all ranks together consumed), so every backend resumes the same way, at any world size. It also
    applies the on_error bound.

    Epochs, as torch's DataLoader and torchdata's StatefulDataLoader have them: every new `iter()`
    starts the next epoch (a new order and new augmentations, seeded by (seed, epoch)), whether the
    previous one was served whole or broken off, unless `set_epoch(e)` or `load_state_dict(s)` was
    called since that iteration began: then the next iteration serves epoch e from its start, or
    the rest of the epoch s was saved in. So a loop that never calls set_epoch (Lightning,
    Accelerate, an old script) and one that calls it before each epoch get the same batches.
    `state_dict()` describes the last iteration: mid-epoch, its position; after the epoch's last
    batch, the start of the next epoch.
    """

    backend: str = ""

    def __init__(self, dataset: Dataset, plan: EpochPlan | ShardPlan, options: LoaderOptions, *, reason: str = "") -> None:
        self.dataset = dataset
        self.plan = plan
        self.options = options
        self.reason = reason
        self.epoch = 0
        self._offset: Any = plan.start  # position where the current (or next) iteration starts
        self._served = 0  # batches handed out since _offset
        self._iterated = False  # an iteration began since the last set_epoch / load_state_dict
        self.skipped: list[BadSample] = []
        self._epoch_bad = 0

    @property
    def shard(self) -> Shard:
        return self.plan.shard

    def __len__(self) -> int:
        return len(self.plan)

    @property
    def real_samples(self) -> int:
        """How many samples this rank yields per epoch before any padding that evens out the ranks."""
        return self.plan.real_samples

    @property
    def position(self) -> Any:
        """Where this epoch stands, for every rank together: the global plan counts the samples of the
        epoch's order consumed; the shard-wise plan lists (world size, samples per rank) segments."""
        return self.plan.offset_after(self._offset, self._served)

    @property
    def batches_done(self) -> int:
        """Batches of the current epoch done, counted at this loader's world size (len(self) at the end)."""
        return len(self.plan) - self.plan.num_batches(self.position)

    @property
    def sampler(self) -> EpochSetter:
        """Lightning calls `loader.sampler.set_epoch(epoch)` at every epoch's start (resuming from a
        checkpoint taken after an epoch ended, it restores no loader state and relies on that call)."""
        return EpochSetter(self)

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch the next iteration reads (its order is seeded by (seed, epoch)). A position
        restored by load_state_dict for this epoch is kept; otherwise the epoch starts at its beginning."""
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        if epoch != self.epoch or self._iterated:
            self.epoch, self._offset, self._served, self._iterated = epoch, self.plan.start, 0, False

    @property
    def epoch_served(self) -> bool:
        """True once the current epoch's last batch was handed out (the next iteration is the next epoch)."""
        return self.plan.num_batches(self.position) == 0

    def state_dict(self) -> dict[str, Any]:
        """Where the last iteration stands; after its epoch's last batch, the start of the next epoch."""
        epoch, position, done = self.epoch, self.position, self.batches_done
        if self.epoch_served:
            epoch, position, done = self.epoch + 1, self.plan.start, 0
        return {"backend": self.backend, "epoch": epoch, **self.plan.save(position),
                "batches_done": done, "seed": self.options.seed, "size": self.plan.size,
                "shuffle": self.plan.shuffle, "batch_size": self.plan.batch_size, "rank": self.shard.rank,
                "world_size": self.shard.world_size, "skipped": len(self.skipped)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a state_dict: the next iteration yields exactly the samples not yet handed
        out by any rank, at this loader's world size (which may differ from the saved one)."""
        mine = self.state_dict()
        for key in ("seed", "size", "shuffle"):
            if key in state and state[key] != mine[key]:
                raise ValueError(f"cannot resume: the state was saved with {key}={state[key]!r}, "
                                 f"this loader has {key}={mine[key]!r}")
        self.epoch, self._offset, self._served, self._iterated = int(state["epoch"]), self.plan.restore(state), 0, False

    def __iter__(self) -> Iterator[Batch]:
        if self._iterated:  # iterated before, and neither set_epoch nor load_state_dict since: the next epoch
            self.epoch, self._offset, self._served = self.epoch + 1, self.plan.start, 0
        self._offset, self._served, self._iterated = self.position, 0, True
        self._epoch_bad = 0 if self._offset == self.plan.start else self._epoch_bad
        try:
            for batch in self._iterate(self.epoch, self._offset):
                self._served += 1
                yield batch
        except Exception as exc:
            died = None if isinstance(exc, WorkerDied) else self._worker_died(exc)
            if died is None:
                raise
            raise died from exc

    def _worker_died(self, exc: Exception) -> WorkerDied | None:
        """The backend's WorkerDied when `exc` means one of its worker processes died, else None."""
        return None

    @abc.abstractmethod
    def _iterate(self, epoch: int, offset: int) -> Iterator[Batch]:
        """Yield this rank's batches of `epoch` from global position `offset` on."""

    def count_bad(self, bad: list[BadSample]) -> None:
        """Log and keep bad samples; stop once this epoch's exceed max_bad_fraction of the rank's share."""
        for b in bad:
            log.warning("skipped record %d (%s): %s; served record %d in its place", b.index, b.path, b.reason,
                        b.substitute)
        self.skipped.extend(bad)
        self._epoch_bad += len(bad)
        share = self.plan.samples_per_rank()
        if bad and self._epoch_bad > self.options.max_bad_fraction * share:
            first = "; ".join(f"{b.path}: {b.reason}" for b in self.skipped[-min(3, len(self.skipped)):])
            raise TooManyBadSamples(
                f"{self._epoch_bad} of this rank's {share} samples in epoch {self.epoch} could not be read or "
                f"decoded, more than max_bad_fraction={self.options.max_bad_fraction} allows (last: {first}). "
                "Convert the folder with `datapipe convert` (it skips and reports bad files) or raise max_bad_fraction.")

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(backend={self.backend!r}, batches={len(self)}, "
                f"batch_size={self.plan.batch_size}, rank={self.shard.rank}/{self.shard.world_size}, "
                f"reason={self.reason!r})")
