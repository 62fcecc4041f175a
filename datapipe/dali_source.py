"""The callable DALI's parallel external_source runs in its worker processes. It pickles without
open handles (spawned workers on GPU machines need that) and each worker opens the store once,
lazily, through datapipe.formats."""
from __future__ import annotations

import numpy as np

from .formats.base import Dataset


class PlannedBatches:
    """Batch number i of this epoch -> (encoded images, labels, record indices), in the plan's order."""

    def __init__(self, dataset: Dataset, batches: list[np.ndarray]) -> None:
        self.dataset = dataset
        self.batches = batches

    def __call__(self, batch_info) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
        if batch_info.iteration >= len(self.batches):
            raise StopIteration
        images, labels, indices = [], [], []
        for index in self.batches[batch_info.iteration]:
            sample = self.dataset[int(index)]
            images.append(np.frombuffer(sample.data, dtype=np.uint8))
            labels.append(np.array(sample.label, dtype=np.int64))
            indices.append(np.array(index, dtype=np.int64))
        return images, labels, indices
