"""The Loader base every backend implements (epochs, resume positions, the bad-sample bound) and Batch."""
from __future__ import annotations

import abc
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from ..augment.batch import BatchStage
from ..augment.recipe import Recipe
from ..augment.resolution import checked_size, size_schedule
from ..formats.base import Dataset
from ..mix.dataset import MixDataset
from ..mix.order import refuse_single_state
from ..order.sharding import EpochOrder, Shard, ShardOrder, refuse_mix_state
from ..storage import redact
from .bad_samples import BadSample, TooManyBadSamples
from .fields import DEFAULT_FIELDS, FieldSpec, batch_class, check_fields, field_spec
from .options import LoaderOptions

log = logging.getLogger(__name__)


class Batch(NamedTuple):
    """images: normalized NCHW on the device (uint8 pixels with dtype=torch.uint8); labels: int64 on
    the device, or float soft targets N x classes when the recipe mixes or smooths (timm's
    convention); indices: int64 dataset record indices, on the host (bookkeeping, not for the model)."""

    images: torch.Tensor
    labels: torch.Tensor
    indices: torch.Tensor


def batch_type(fields: tuple[str, ...] = DEFAULT_FIELDS) -> type:
    """The class of a loader's batches for `fields`: Batch for the default, else a named tuple of
    the fields' attributes (field + "s") and `indices` (datapipe.backends.fields)."""
    return Batch if check_fields(fields) == DEFAULT_FIELDS else batch_class(fields)


class EpochSetter:
    """`loader.sampler.set_epoch(e)`, the same as `loader.set_epoch(e)`: where PyTorch Lightning
    sets the epoch of a loader that is not a DataLoader, and where scripts written for a DataLoader
    with a DistributedSampler do."""

    def __init__(self, loader: "Loader") -> None:
        self.set_epoch = loader.set_epoch


class NotADataLoader:
    """A torch DataLoader attribute that a loader does not have. Code that rebuilds a DataLoader from
    the one it is given reads it (ray.train.torch.prepare_data_loader: to add a DistributedSampler);
    reading it raises an AttributeError that says why, so hasattr and getattr(x, name, default) see
    no attribute, as before."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, loader: Any, owner: type | None = None) -> Any:
        if loader is None:
            return self
        raise AttributeError(f"{type(loader).__name__!r} object has no attribute {self.name!r}: a datapipe loader is "
                             "not a torch DataLoader to rebuild (ray.train.torch.prepare_data_loader does); it already "
                             "shards by rank and puts batches on the device: use it as it is (docs/trainers.md)")


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
    worker_init_fn, collate_fn, generator, batch_sampler = (NotADataLoader() for _ in range(4))

    def __init__(self, dataset: Dataset, order: EpochOrder | ShardOrder, options: LoaderOptions, *, reason: str = "") -> None:
        self.dataset = dataset
        self.mix = dataset.mix if isinstance(dataset, MixDataset) else None
        self.order = order
        self.options = options
        self.reason = reason
        self.epoch = 0
        self._offset: Any = order.start  # position where the current (or next) iteration starts
        self._served = 0  # batches handed out since _offset
        self._iterated = False  # an iteration began since the last set_epoch / load_state_dict
        self.skipped: list[BadSample] = []
        self._epoch_bad = 0
        self._size_schedule: Callable[[int], int] = size_schedule(options.image_size)
        recipe = options.recipe
        self.stage = BatchStage(recipe, seed=options.seed, num_classes=len(dataset.classes),
                                normalized=options.dtype != torch.uint8) if recipe.batch_stage and options.train else None
        # None for the default fields: backends then read samples as before (no record() call, no extra column)
        spec = field_spec(options.fields, options.tokenizer, dataset, recipe=recipe, train=options.train)
        self.field_spec: FieldSpec | None = None if spec.default else spec
        self._field_device = options.torch_device if self.field_spec is not None else None

    @property
    def recipe(self) -> Recipe:
        return self.options.recipe

    def set_image_size(self, size: "int | Callable[[int], int]") -> None:
        """The train image size from the next iteration that starts an epoch on: a size, or a function
        of the epoch (datapipe.SizeRamp: FFCV's progressive resizing). Workers and DALI's pipeline are
        kept; the order of records does not change."""
        if isinstance(size, int):  # a fixed size: checked now, its batch too (a schedule's: per epoch)
            self.options.check_batch(checked_size(size, self.epoch), self.epoch)
        self._size_schedule = size_schedule(size)

    def image_size_at(self, epoch: int) -> int:
        """The image size epoch `epoch` is served at: checked, and its batch within MAX_BATCH_BYTES."""
        return self.options.check_batch(checked_size(self._size_schedule(epoch), epoch), epoch)

    @property
    def shard(self) -> Shard:
        return self.order.shard

    @property
    def pool_history(self) -> list[tuple[int, int]] | None:
        """A pool's sizes, (batches received, actors) at each change, for backends with a pool (ray);
        None for the others (datapipe train's metrics.jsonl and TensorBoard show it)."""
        return None

    def __len__(self) -> int:
        return len(self.order)

    @property
    def real_samples(self) -> int:
        """How many samples this rank yields per epoch before any padding that evens out the ranks."""
        return self.order.real_samples

    @property
    def position(self) -> Any:
        """Where this epoch stands, for every rank together: under the global order, the samples of the
        epoch consumed; under the shard-wise order, a list of (world size, samples per rank) segments."""
        return self.order.offset_after(self._offset, self._served)

    @property
    def batches_done(self) -> int:
        """Batches of the current epoch done, counted at this loader's world size (len(self) at the end)."""
        return len(self.order) - self.order.num_batches(self.position)

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
            self.epoch, self._offset, self._served, self._iterated = epoch, self.order.start, 0, False

    @property
    def epoch_served(self) -> bool:
        """True once the current epoch's last batch was handed out (the next iteration is the next epoch)."""
        return self.order.num_batches(self.position) == 0

    def state_dict(self) -> dict[str, Any]:
        """Where the last iteration stands; after its epoch's last batch, the start of the next epoch."""
        epoch, position, done = self.epoch, self.position, self.batches_done
        if self.epoch_served:
            epoch, position, done = self.epoch + 1, self.order.start, 0
        return {"backend": self.backend, "epoch": epoch, **self.order.save(position, epoch),
                "batches_done": done, "seed": self.options.seed, "size": self.order.size,
                "shuffle": self.order.shuffle, "batch_size": self.order.batch_size, "rank": self.shard.rank,
                "world_size": self.shard.world_size, "skipped": len(self.skipped),
                "recipe": self.recipe.to_dict(), "image_size": self.image_size_at(epoch),
                "dataset": self.dataset.fingerprint}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a state_dict: the next iteration yields exactly the samples not yet handed
        out by any rank, at this loader's world size (which may differ from the saved one)."""
        (refuse_mix_state if self.mix is None else refuse_single_state)(state)  # first: the other kind's keys differ
        mine = self.state_dict()
        for key in ("seed", "shuffle") + (("size",) if self.mix is None else ()):  # a mix checks its own
            if key in state and state[key] != mine[key]:
                raise ValueError(f"cannot resume: the state was saved with {key}={state[key]!r}, "
                                 f"this loader has {key}={mine[key]!r}")
        if state.get("dataset") and mine["dataset"] and state["dataset"] != mine["dataset"]:
            raise ValueError(f"cannot resume: the state was saved over other records than {redact(self.dataset.path)} "
                             "holds now (another dataset, this one re-converted, or an image folder's files renamed, "
                             "moved, added or removed since); resume with the dataset it was saved with")
        if mine["dataset"] and not state.get("dataset") and state.get("samples_done"):  # saved before folders had one
            log.warning("resuming mid-epoch over %s from a state without its fingerprint: not checked against changes "
                        "since it was saved", redact(self.dataset.path))
        saved_size, epoch = state.get("image_size"), int(state["epoch"])
        if saved_size is not None and state.get("batches_done") and saved_size != self.image_size_at(epoch):
            raise ValueError(f"cannot resume: epoch {epoch} was served at image_size {saved_size}, this loader serves "
                             f"it at {self.image_size_at(epoch)}; give the same image_size (or schedule) to resume "
                             "mid-epoch")
        if "recipe" in state and Recipe.from_dict(state["recipe"]) != self.recipe:
            diff = Recipe.from_dict(state["recipe"]).describe_difference(self.recipe)
            raise ValueError(f"cannot resume: the state was saved with another augmentation recipe ({diff}); "
                             "resume with the recipe it was saved with")
        self.epoch, self._offset, self._served, self._iterated = int(state["epoch"]), self.order.restore(state), 0, False

    def __iter__(self) -> Iterator[Batch | tuple]:
        """This epoch's batches, as Batch(images, labels, indices) (or the batch of the fields asked
        for), or the first two fields with batch_format="pair"; a batch counts as served (state_dict)
        once it is handed out. A backend yields Batch, or (Batch, extra columns) when fields are asked for."""
        if self._iterated:  # iterated before, and neither set_epoch nor load_state_dict since: the next epoch
            self.epoch, self._offset, self._served = self.epoch + 1, self.order.start, 0
        self._offset, self._served, self._iterated = self.position, 0, True
        self._epoch_bad = 0 if self._offset == self.order.start else self._epoch_bad
        keys, pair, spec = self._repeat_keys(), self.options.batch_format == "pair", self.field_spec
        for batch in self._iterate(self.epoch, self._offset):
            if spec is not None:
                batch, columns = batch
            if self.stage is not None:
                batch = self._batch_stage(batch, None if keys is None else keys[self._served])
            self._served += 1
            if self.mix is not None:  # indices inside each source, and which source
                sources, local = self.dataset.sources_of(batch.indices.numpy())
                batch = Batch(batch.images, batch.labels, torch.from_numpy(local))
                if spec is not None and "source" in spec.fields:
                    columns = {**columns, "source": torch.from_numpy(sources)}
            if spec is not None:
                batch = spec.batch(*batch, columns, self._field_device)
            yield (batch[0], batch[1]) if pair else batch

    def _repeat_keys(self) -> Sequence[np.ndarray] | None:
        """Under repeated augmentation (or a mix whose source repeats a record in an epoch) with erasing,
        this iteration's batches as the order's keys (a record's copies have keys of their own, so their
        erasing boxes differ); else None."""
        if self.stage is None or self.order.keys_are_records or self.recipe.re_prob == 0:
            return None
        return self.order.batches(self.epoch, self._offset)

    def _batch_stage(self, batch: Batch, keys=None) -> Batch:
        """Erasing, mixup/cutmix and soft targets, seeded by the batch's position in the epoch."""
        keys = batch.indices if keys is None else torch.as_tensor(keys)
        images, labels = self.stage(batch.images, batch.labels, keys, epoch=self.epoch, position=self.position,
                                    rank=self.shard.rank)
        return Batch(images, labels, batch.indices)

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
        share = self.order.samples_per_rank()
        if bad and self._epoch_bad > self.options.max_bad_fraction * share:
            first = "; ".join(f"{b.path}: {b.reason}" for b in self.skipped[-min(3, len(self.skipped)):])
            raise TooManyBadSamples(
                f"{self._epoch_bad} of this rank's {share} samples in epoch {self.epoch} could not be read or "
                f"decoded, more than max_bad_fraction={self.options.max_bad_fraction} allows (last: {first}). "
                "Convert the folder with `datapipe convert` (it skips and reports bad files) or raise max_bad_fraction.")

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(backend={self.backend!r}, batches={len(self)}, "
                f"batch_size={self.order.batch_size}, rank={self.shard.rank}/{self.shard.world_size}, "
                f"reason={self.reason!r})")
