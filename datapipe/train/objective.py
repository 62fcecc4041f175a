"""The loss and the train accuracy for integer labels and for soft targets (timm's convention).

A loader whose recipe mixes or smooths yields float targets N x classes (datapipe.augment.batch):
those get timm's SoftTargetCrossEntropy, and are not smoothed again (the recipe's smoothing is in
them); integer labels get CrossEntropyLoss with the config's smoothing (datapipe.train.config)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def is_soft(labels: torch.Tensor) -> bool:
    """Soft targets: float, N x classes; integer labels: int64, N."""
    return labels.ndim == 2 and labels.is_floating_point()


def soft_target_cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """timm.loss.SoftTargetCrossEntropy: mean over the batch of -sum(target * log_softmax(logits))."""
    return torch.sum(-target * F.log_softmax(logits, dim=-1), dim=-1).mean()


class Criterion(nn.Module):
    """Cross-entropy on either kind of label: soft targets as they are, integer labels smoothed by
    `label_smoothing`."""

    def __init__(self, label_smoothing: float = 0.0) -> None:
        super().__init__()
        # label -1 (a record without one) adds nothing: the loop counts such records and refuses them
        self.hard = nn.CrossEntropyLoss(label_smoothing=label_smoothing, ignore_index=-1)

    def forward(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if is_soft(labels):
            return soft_target_cross_entropy(logits, labels)
        return self.hard(logits, labels)


def count_correct(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Top-1 hits as a float device tensor (no sync). Soft targets: the target's argmax is the class
    (for a mixed image, the one with the larger share; timm's train accuracy is not defined there)."""
    target = labels.argmax(1) if is_soft(labels) else labels
    return (logits.argmax(1) == target).sum().float()


def unlabelled(labels: torch.Tensor) -> torch.Tensor:
    """Samples without a label, as a device tensor (no sync): label -1; in soft targets (mixup, cutmix,
    smoothing) a row summing under 1, the batch stage's zeros for a -1 record and its mixing partner's."""
    if labels.ndim == 1:
        return (labels < 0).sum()
    return (labels.sum(dim=1) < 0.999).sum()
