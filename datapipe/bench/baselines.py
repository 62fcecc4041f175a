"""The references every figure is compared with, measured on the same data in the same run.

- naive: what most training scripts do (torchvision ImageFolder style): PIL open + convert('RGB')
  (full decode), RandomResizedCrop as crop-then-resize, ToTensor and Normalize as float work in the
  workers, default collate, DataLoader(shuffle=True, num_workers=cores).
- plain DALI: readers.file + decoders.image_random_crop + resize + crop_mirror_normalize, CPU
  operators, as DALI's own examples write it (image folders only).
"""
from __future__ import annotations

import io
import random

import numpy as np
import torch
from PIL import Image

from ..augment.plan import random_resized_crop
from ..backends.normalize import IMAGENET_MEAN, IMAGENET_STD
from ..formats.base import Dataset
from ..image.geometry import RATIO, SCALE


class NaiveImageFolder(torch.utils.data.Dataset):
    """ImageFolder + RandomResizedCrop + RandomHorizontalFlip + ToTensor + Normalize, done naively."""

    def __init__(self, dataset: Dataset, size: int) -> None:
        self.dataset, self.size = dataset, size
        self.mean = torch.tensor(IMAGENET_MEAN).view(3, 1, 1)
        self.std = torch.tensor(IMAGENET_STD).view(3, 1, 1)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        """The view of `index`; a file that does not decode (an image folder may hold one) is replaced
        by the next, as datapipe's loaders do, so that the row times the loading, not the first
        corrupt file. torchvision's ImageFolder would raise there."""
        for offset in range(len(self)):
            try:
                return self._view((index + offset) % len(self))
            except Exception:  # noqa: PERF203 (rare)
                continue
        raise ValueError(f"no image of {self.dataset} decodes")

    def _view(self, index: int) -> tuple[torch.Tensor, int]:
        sample = self.dataset[index]
        img = Image.open(io.BytesIO(sample.data)).convert("RGB")
        crop = random_resized_crop(img.width, img.height, random.Random())
        img = img.crop((crop.left, crop.top, crop.left + crop.width, crop.top + crop.height))
        img = img.resize((self.size, self.size), Image.Resampling.BILINEAR)
        if crop.flip:
            img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        tensor = torch.from_numpy(np.array(img)).permute(2, 0, 1).float().div(255)
        return (tensor - self.mean) / self.std, sample.label


def naive_loader(dataset: Dataset, *, batch_size: int, size: int, workers: int) -> torch.utils.data.DataLoader:
    return torch.utils.data.DataLoader(NaiveImageFolder(dataset, size), batch_size=batch_size, shuffle=True,
                                       num_workers=workers, persistent_workers=workers > 0)


def plain_dali_loader(files: list[str], labels: list[int], *, batch_size: int, size: int, workers: int):
    """DALI's textbook CPU training pipeline over image files, through its PyTorch iterator."""
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

    @pipeline_def(batch_size=batch_size, num_threads=workers, device_id=None)
    def pipe():
        jpegs, labels_ = fn.readers.file(files=files, labels=labels, random_shuffle=True, name="reader")
        images = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB,
                                               random_area=list(SCALE), random_aspect_ratio=list(RATIO))
        images = fn.resize(images, resize_x=size, resize_y=size)
        images = fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="CHW",
                                          mean=[m * 255 for m in IMAGENET_MEAN], std=[s * 255 for s in IMAGENET_STD],
                                          mirror=fn.random.coin_flip())
        return images, labels_

    p = pipe()
    p.build()
    return DALIGenericIterator([p], ["images", "labels"], reader_name="reader",
                               last_batch_policy=LastBatchPolicy.PARTIAL, auto_reset=True)
