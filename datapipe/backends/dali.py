"""DALI backend: decode (nvJPEG `mixed` on CUDA, CPU operators otherwise), crop, flip, normalize.

Inputs, by source:
- this project's WebDataset shards: `fn.readers.webdataset` with the `.idx` files; sharded by DALI
  (shard_id/num_shards, pad_last_batch), shuffled with a seed drawn from (seed, epoch);
- a plain image folder: `fn.readers.file`, fed this epoch's order from datapipe.sharding, with the
  record indices passed as its `labels`;
- LMDB, HDF5 and other tools' shards: a parallel `fn.external_source` whose worker processes open
  the store once each, fed the same order.
A pipeline is built per epoch. Mid-epoch resume: the planned inputs start at the next batch; the
WebDataset reader is fast-forwarded through the batches already served.
"""
from __future__ import annotations

import logging
from collections.abc import Iterator

import numpy as np
import torch

from ..dali_source import PlannedBatches
from ..formats.base import Dataset
from ..formats.folder import FolderDataset
from ..formats.wds import WdsDataset, idx_name
from ..sharding import EpochPlan
from ..transforms import EVAL_CROP_RATIO, RATIO, SCALE
from .base import IMAGENET_MEAN, IMAGENET_STD, Batch, Loader, LoaderOptions

log = logging.getLogger(__name__)
PIP_HINT = "pip install 'datapipe[dali]' (the nvidia-dali-cuda120 wheel)"


def require_dali():
    """The nvidia.dali module, or an ImportError naming the extra to install."""
    try:
        import nvidia.dali
        import nvidia.dali.plugin.pytorch  # noqa: F401
    except ImportError as exc:
        raise ImportError(f"the dali backend needs NVIDIA DALI: {PIP_HINT}") from exc
    return nvidia.dali


def _augment(jpegs, *, train: bool, size: int, decoder: str, layout: str, half: bool):
    from nvidia.dali import fn, types

    dtype = types.FLOAT16 if half else types.FLOAT
    norm = dict(mean=[m * 255 for m in IMAGENET_MEAN], std=[s * 255 for s in IMAGENET_STD],
                dtype=dtype, output_layout=layout, crop=(size, size))
    if train:
        images = fn.decoders.image_random_crop(jpegs, device=decoder, output_type=types.RGB, random_area=list(SCALE),
                                               random_aspect_ratio=list(RATIO), num_attempts=10)
        images = fn.resize(images, resize_x=size, resize_y=size, interp_type=types.INTERP_LINEAR, antialias=True)
        return fn.crop_mirror_normalize(images, mirror=fn.random.coin_flip(probability=0.5), **norm)
    images = fn.decoders.image(jpegs, device=decoder, output_type=types.RGB)
    images = fn.resize(images, resize_shorter=size / EVAL_CROP_RATIO, interp_type=types.INTERP_LINEAR, antialias=True)
    return fn.crop_mirror_normalize(images, crop_pos_x=0.5, crop_pos_y=0.5, **norm)


class DaliLoader(Loader):
    """One DALI pipeline per epoch, read through DALI's PyTorch iterator."""

    backend = "dali"

    def __init__(self, dataset: Dataset, plan: EpochPlan, options: LoaderOptions, *, reason: str = "") -> None:
        require_dali()
        super().__init__(dataset, plan, options, reason=reason)
        self.device = options.torch_device
        self.labels = None
        if isinstance(dataset, FolderDataset):
            self.source = "readers.file"
            self.labels = torch.tensor([f.label for f in dataset.files], dtype=torch.int64)
        elif isinstance(dataset, WdsDataset):
            self.source = "readers.webdataset"
        else:
            self.source = "external_source"

    @property
    def real_samples(self) -> int:
        if self.source != "readers.webdataset":
            return self.plan.real_samples
        n, rank, world = self.plan.size, self.shard.rank, self.shard.world_size
        return (rank + 1) * n // world - rank * n // world  # DALI's contiguous shard of this rank

    def _inputs(self, epoch: int, start: int):
        """(encoded images, labels or None, record indices) DataNodes for this epoch from `start`."""
        from nvidia.dali import fn, types

        shuffle_seed = int(np.random.default_rng([self.options.seed, epoch]).integers(2**31))
        if self.source == "readers.webdataset":
            tars = self.dataset.index.shards
            images, ids = fn.readers.webdataset(
                paths=tars, index_paths=[idx_name(t) for t in tars], ext=["jpg;png", "i64"],
                dtypes=[types.UINT8, types.INT64], missing_component_behavior="error",
                shard_id=self.shard.rank, num_shards=self.shard.world_size, random_shuffle=self.plan.shuffle,
                initial_fill=min(4096, self.plan.size), seed=shuffle_seed, pad_last_batch=True,
                stick_to_shard=True, name="reader")
            return images, fn.slice(ids, 1, 1, axes=[0]), fn.slice(ids, 0, 1, axes=[0])
        batches = self.plan.batches(epoch, start)
        if self.source == "readers.file":
            order = np.concatenate(batches)
            images, indices = fn.readers.file(files=[str(self.dataset.files[i].path) for i in order],
                                              labels=[int(i) for i in order], random_shuffle=False, name="reader")
            return images, None, indices
        return fn.external_source(source=PlannedBatches(self.dataset, batches), num_outputs=3, batch=True,
                                  batch_info=True, parallel=True, dtype=[types.UINT8, types.INT64, types.INT64])

    def _pipeline(self, epoch: int, start: int):
        from nvidia.dali import Pipeline

        cuda = self.device.type == "cuda"
        workers = max(1, self.options.workers)
        pipe = Pipeline(batch_size=self.plan.batch_size, num_threads=workers,
                        device_id=(self.device.index or 0) if cuda else None,
                        seed=int(np.random.default_rng([self.options.seed, epoch, 1]).integers(2**31)),
                        py_num_workers=workers, prefetch_queue_depth=2,
                        py_start_method="spawn" if torch.cuda.is_initialized() else "fork")
        with pipe:
            images, labels, indices = self._inputs(epoch, start)
            images = _augment(images, train=self.options.train, size=self.options.image_size,
                              decoder="mixed" if cuda else "cpu",
                              layout="HWC" if self.options.channels_last else "CHW",
                              half=self.options.dtype == torch.float16)
            pipe.set_outputs(*((images, indices) if labels is None else (images, labels, indices)))
        return pipe

    def _iterate(self, epoch: int, start: int) -> Iterator[Batch]:
        from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

        native = self.source == "readers.webdataset"
        if start >= len(self.plan):
            return
        pipe = self._pipeline(epoch, start if not native else 0)
        names = ["images", "indices"] if self.source == "readers.file" else ["images", "labels", "indices"]
        policy = LastBatchPolicy.DROP if self.plan.drop_last else LastBatchPolicy.PARTIAL
        reader = "reader" if self.source != "external_source" else None
        iterator = DALIGenericIterator([pipe], names, reader_name=reader, last_batch_policy=policy,
                                       auto_reset=False, prepare_first_batch=False)
        for number, outputs in enumerate(iterator):
            if native and number < start:
                continue  # fast-forward: DALI's own order is reproduced exactly, then the served part skipped
            if number >= len(self.plan):
                break
            yield self._to_batch(outputs[0])

    def _to_batch(self, out: dict[str, torch.Tensor]) -> Batch:
        indices = out["indices"].reshape(-1).to("cpu", torch.int64)
        labels = self.labels[indices] if self.labels is not None else out["labels"].reshape(-1).to(torch.int64)
        images = out["images"]
        if self.options.channels_last:
            images = images.permute(0, 3, 1, 2)
        images = images.to(self.device, self.options.dtype, non_blocking=True)
        fmt = torch.channels_last if self.options.channels_last else torch.contiguous_format
        return Batch(images.contiguous(memory_format=fmt), labels.to(self.device, non_blocking=True), indices)
