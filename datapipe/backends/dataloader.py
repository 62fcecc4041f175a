"""torch DataLoader backend: decode + augment to uint8 in worker processes, normalize on the device."""
from __future__ import annotations

import contextlib
import functools
import itertools
import logging
from collections.abc import Iterator

import numpy as np
import torch

from ..augment.cpu import apply_plan
from ..augment.custom import apply_transform
from ..augment.plan import SamplePlan, fill_color
from ..augment.recipe import Recipe
from ..augment.view import plan_and_decode
from ..formats.base import Dataset
from ..mix.dataset import recipe_lookup
from ..order.sharding import EpochOrder, READ_AHEAD_SHARDS, ShardOrder, record_of
from ..records import Fields
from ..storage.isolate import forks_nothing
from .bad_samples import BadSample, serve_or_substitute
from .base import Batch, Loader
from .deaths import DEFERRED, WorkerDied, shield_worker, torch_worker_died, workers_start_deaf
from .fields import FieldSpec, check_picklable
from .normalize import Normalizer
from .options import LoaderOptions

log = logging.getLogger(__name__)
Decoded = tuple[torch.Tensor, int, int, BadSample | None]  # + the extra fields' values when fields are asked for
# normalized host batches (a CPU device) kept for reuse: the caller's, the one being made, its
# float32 step (bf16/fp16), and one a trainer may hold ahead (Lightning's prefetching fetcher)
KEEP_BATCHES = 4


Item = tuple[int, int, "tuple[int, ...] | None", int]  # epoch, record, shards to read ahead, image size


class DecodedRecords(torch.utils.data.Dataset):
    """(epoch, index, ahead, size) -> (uint8 CHW tensor, label, index served, BadSample or None): the
    record's view and pixel ops as its plan (datapipe.augment.plan.plan_sample, one call) says;
    with `fields`, also the served record's values of the extra fields (its caption tokenized here).

    A record that cannot be read or decoded raises under on_error="raise" (naming it); under "skip"
    another record, chosen reproducibly, is served in its place so the batch keeps its size."""

    def __init__(self, dataset: Dataset, options: LoaderOptions, fields: FieldSpec | None = None) -> None:
        self.dataset, self.fields = dataset, fields
        self.train, self.seed, self.recipe, self.transform = options.train, options.seed, options.recipe, options.transform
        self.fill = fill_color(options.recipe)
        self.recipe_of = recipe_lookup(dataset)  # a mix's per-source recipes, else None
        self.skip = options.on_error == "skip"

    def __len__(self) -> int:
        return len(self.dataset)

    def _decode(self, epoch: int, index: int, size: int, key: int) -> tuple[torch.Tensor, int, SamplePlan,
                                                                          Fields | None, Recipe]:
        """Record `index` read, its plan drawn (the one planner call; `key` keys it: the record, or its
        repeat's key) and decoded to its view: the part a bad record can fail. Its stored fields when
        asked for, and the recipe it was planned with (a mix's source may have its own)."""
        sample = self.dataset[index] if self.fields is None else self.dataset.record(index)
        recipe = self.recipe if self.recipe_of is None else self.recipe_of(index, self.recipe)
        pixels, plan = plan_and_decode(sample.data, recipe, self.seed, epoch, key, size, train=self.train)
        return pixels, sample.label, plan, None if self.fields is None else sample.fields, recipe

    def _augment(self, pixels: torch.Tensor, plan: SamplePlan, recipe: Recipe) -> torch.Tensor:
        """The planned ops and the user's transform: outside the bad-record policy, so an error here
        (a bug, not bad data) is raised, never served around."""
        if plan.ops or plan.augmix:
            pixels = apply_plan(pixels, plan, fill=self.fill if recipe is self.recipe else fill_color(recipe))
        if self.transform is not None:
            pixels = apply_transform(self.transform, pixels, plan.transform_seed)
        return pixels

    def __getitem__(self, item: Item) -> Decoded:
        epoch, key, ahead, size = item
        if ahead:
            self.dataset.read_ahead(list(ahead))
        index = record_of(key, len(self.dataset))
        (pixels, label, plan, stored, recipe), served, bad = serve_or_substitute(
            lambda i: self._decode(epoch, i, size, key if i == index else i), self.dataset, index, seed=self.seed,
            epoch=epoch, skip=self.skip)
        if self.train:
            pixels = self._augment(pixels, plan, recipe)
        if self.fields is None:
            return pixels, label, served, bad
        return pixels, label, served, bad, self.fields.values(stored)  # outside the policy, as _augment


def collate(items: list[Decoded], fields: FieldSpec | None = None) -> tuple:
    """Stack the samples (uint8 NCHW) and pass the bad ones (already substituted) on for counting;
    with `fields`, the extra fields' columns after them."""
    bad = [it[3] for it in items if it[3] is not None]
    first = items[0][0]
    out = None
    if torch.utils.data.get_worker_info() is not None:  # stack straight into shared memory (no copy on send)
        storage = first.untyped_storage()._new_shared(len(items) * first.numel() * first.element_size())
        out = first.new(storage).view(len(items), *first.shape)
    images = torch.stack([g[0] for g in items], out=out)
    labels = torch.tensor([g[1] for g in items], dtype=torch.int64)
    indices = torch.tensor([g[2] for g in items], dtype=torch.int64)
    if fields is not None:
        return images, labels, indices, bad, fields.columns([g[4] for g in items])
    return images, labels, indices, bad


class EpochBatches:
    """The batch sampler: lists of (epoch, index, shards to read ahead) for the configured epoch, from
    a position on. A remote dataset read shard-wise gets, with each batch's first sample, the next
    shards this rank will read, so the worker that reads it starts fetching them."""

    def __init__(self, order: EpochOrder | ShardOrder, *, read_ahead: int = 0, size: int = 224) -> None:
        self.order, self.epoch, self.offset, self.size = order, 0, order.start, size
        self.read_ahead = read_ahead if isinstance(order, ShardOrder) else 0

    def __len__(self) -> int:
        return self.order.num_batches(self.offset)

    def __iter__(self) -> Iterator[list[Item]]:
        batches = self.order.batches(self.epoch, self.offset)  # each computed when the sampler reaches it
        hints = self.order.shards_ahead(batches, self.read_ahead) if self.read_ahead else itertools.repeat(None)
        for batch, hint in zip(batches, hints):
            yield [(self.epoch, int(i), hint if k == 0 else None, self.size) for k, i in enumerate(batch)]


def _seed_worker(worker_id: int) -> None:
    """Worker init: NumPy's seed from torch's, the mark that lets this worker, which forks nothing,
    call the object store directly (datapipe.storage.isolate), and no stop signal meant for the job
    (deaths.shield_worker)."""
    forks_nothing()
    shield_worker()
    seed = torch.initial_seed() % 2**32
    np.random.seed(seed)


class ProcessLoader(Loader):
    """The `dataloader` backend: torch's DataLoader with worker processes and pinned memory; uint8
    crosses to the device, float work happens there."""

    backend = "dataloader"

    def __init__(self, dataset: Dataset, order: EpochOrder | ShardOrder, options: LoaderOptions, *, reason: str = "") -> None:
        super().__init__(dataset, order, options, reason=reason)
        self.device = options.torch_device
        workers = options.workers
        if workers and options.start_method in ("spawn", "forkserver"):
            check_picklable(options.tokenizer, f"the DataLoader's workers (start_method={options.start_method!r})")
            if self.mix is not None:
                self.mix.check_picklable(f"the DataLoader's workers (start_method={options.start_method!r})")
        self.batch_order = EpochBatches(order, read_ahead=READ_AHEAD_SHARDS if dataset.location.remote else 0,
                                        size=options.image_size)
        self.loader = torch.utils.data.DataLoader(
            DecodedRecords(dataset, options, self.field_spec), batch_sampler=self.batch_order,
            collate_fn=collate if self.field_spec is None else functools.partial(collate, fields=self.field_spec),
            num_workers=workers, pin_memory=options.pinned, worker_init_fn=_seed_worker,
            prefetch_factor=options.prefetch_factor if workers else None,
            persistent_workers=workers > 0 and options.persistent_workers,
            multiprocessing_context=options.start_method if workers else None)
        self.normalize = Normalizer(self.device, options.dtype, options.channels_last, keep=KEEP_BATCHES,
                                    mean=options.recipe.mean, std=options.recipe.std)

    def host_batches(self, epoch: int, offset: int) -> Iterator[tuple]:
        """(images, labels, indices): uint8 NCHW batches on the host (pinned where CUDA is used), bad
        samples counted and logged; the extra fields' columns after them when fields are asked for."""
        self.batch_order.epoch, self.batch_order.offset, self.batch_order.size = epoch, offset, self.image_size_at(epoch)
        with self._workers_stopped_on_error(), DEFERRED.fetch(), workers_start_deaf():
            batches = iter(self.loader)  # a persistent worker may have died since the last epoch
        if self.options.workers:
            DEFERRED.install()  # after iter(): torch installs its SIGCHLD handler there (deaths.py)
        while True:
            with self._workers_stopped_on_error(batches), DEFERRED.fetch():
                batch = next(batches, None)
            if batch is None:
                return
            images, labels, indices, bad, *columns = batch
            self.count_bad(bad)
            yield images, labels, indices, *columns

    @contextlib.contextmanager
    def _workers_stopped_on_error(self, batches: Iterator | None = None) -> Iterator[None]:
        """An error out of torch's DataLoader (`batches`, or the persistent iterator it keeps) ends the
        epoch: a dead worker becomes one WorkerDied (told apart before the stop reaps the workers), and
        the workers are stopped now. Otherwise the error's traceback keeps torch's iterator (and the
        DataLoader a persistent one), the garbage collector finalizes it after its queues' own
        finalizers ran, its stop message never reaches the workers, and it waits 5 s for each worker
        before killing it: a 40 s stall at some later collection with 8 workers. Persistent workers
        are started afresh at the next iteration."""
        try:
            yield
        except BaseException as exc:
            died = None
            if self.options.workers and isinstance(exc, Exception) and not isinstance(exc, WorkerDied):
                died = torch_worker_died(self.backend, exc)
            self._stop_workers(batches if batches is not None else getattr(self.loader, "_iterator", None))
            if died is None:
                raise
            raise died from exc

    def _stop_workers(self, batches: Iterator | None) -> None:
        """torch's worker processes of `batches` stopped (its own private method), and a persistent
        iterator dropped so that the DataLoader makes a new one, with new workers."""
        stop = getattr(batches, "_shutdown_workers", None)  # torch's multi-process iterator
        if stop is None:
            return
        stop()
        if getattr(self.loader, "_iterator", None) is batches:
            self.loader._iterator = None

    def to_device(self, images: torch.Tensor, labels: torch.Tensor, indices: torch.Tensor) -> Batch:
        return self.normalize.batch(images, labels, indices)

    def device_batch(self, host: tuple) -> Batch | tuple[Batch, dict]:
        """A host batch on the device; with fields, (that Batch, the extra fields' columns)."""
        if self.field_spec is None:
            return self.to_device(*host)
        return self.to_device(*host[:3]), host[3]

    def _iterate(self, epoch: int, offset: int) -> Iterator[Batch | tuple[Batch, dict]]:
        try:
            for host in self.host_batches(epoch, offset):
                yield self.device_batch(host)
        finally:
            self.normalize.release()
