"""The batch stage every backend shares, on the output device: random erasing (timm's
RandomErasing, on the normalized images), mixup / cutmix (timm's Mixup, batch or elem mode, the
partner of sample i is sample N-1-i) and label smoothing (soft targets N x classes).

Every random draw comes from the planner (datapipe.augment.plan): erasing by (seed, epoch, record),
mixing by (seed, epoch, the batch's position in the epoch, rank), so a resumed epoch gets exactly the
uninterrupted run's batches and targets. This module only applies them."""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .batch_plan import MixupPlan, erase_noise, plan_erase, plan_mix
from .recipe import Recipe


class BatchStage:
    """(images, labels, indices) -> the recipe's erased, mixed images and (soft) targets."""

    def __init__(self, recipe: Recipe, *, seed: int, num_classes: int, normalized: bool = True) -> None:
        if recipe.soft_targets and num_classes < 1:
            raise ValueError("mixup, cutmix and label smoothing need the dataset's classes; this one has none")
        self.recipe, self.seed, self.num_classes, self.normalized = recipe, seed, num_classes, normalized

    def __call__(self, images: torch.Tensor, labels: torch.Tensor, indices: torch.Tensor, *, epoch: int,
                 position: Any, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
        """`images` erased and mixed in place (the batch is the loader's own), and the targets.
        `indices`: the records' keys (record indices, or their repeats' keys). On a CPU device the
        decode threads own the cores: torch runs this in one thread, as the normalize does."""
        if images.device.type != "cpu":
            return self._apply(images, labels, indices, epoch, position, rank)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return self._apply(images, labels, indices, epoch, position, rank)
        finally:
            torch.set_num_threads(threads)

    def _apply(self, images, labels, indices, epoch, position, rank):
        r = self.recipe
        if r.re_prob > 0:
            images = self.erase(images, indices, epoch)
        if not r.soft_targets:
            return images, labels
        lam = torch.ones(len(labels))
        if r.mixes and len(labels):
            mix = plan_mix(r, self.seed, epoch, position, rank, len(labels), *images.shape[-2:])
            images, lam = (self._mix_batch if r.mix_mode == "batch" else self._mix_elem)(images, mix)
        return images, self.targets(labels, lam.to(labels.device))

    def targets(self, labels: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
        """timm's mixup_target: smoothed one-hots of each label and of its partner's, mixed by lam. A record
        without a label (-1) gives a row of zeros: it adds nothing to the loss (datapipe train counts such
        records and refuses them; it was an index error here, before the loop saw the batch)."""
        off = self.recipe.label_smoothing / self.num_classes
        on = 1.0 - self.recipe.label_smoothing + off
        def one_hot(y: torch.Tensor) -> torch.Tensor:
            out = torch.full((len(y), self.num_classes), off, device=y.device)
            out.scatter_(1, y.long().clamp(min=0).view(-1, 1), on)
            return out * (y >= 0).view(-1, 1)
        lam = lam.view(-1, 1).to(torch.float32)
        return one_hot(labels) * lam + one_hot(labels.flip(0)) * (1 - lam)

    # -- erasing -------------------------------------------------------------------------------
    def erase(self, images: torch.Tensor, indices: torch.Tensor, epoch: int) -> torch.Tensor:
        """Each record's planned boxes filled: const 0 (normalized; the mean colour in uint8), rand one
        normal colour per box, pixel normal noise per pixel; the noise from the record's own seed."""
        size = images.shape[-1]
        mean = torch.tensor(self.recipe.mean).view(3, 1, 1)
        std = torch.tensor(self.recipe.std).view(3, 1, 1)
        for k, index in enumerate(indices.tolist()):
            boxes, noise_seed = plan_erase(self.recipe, self.seed, epoch, int(index), size)
            if not boxes:
                continue
            mode = self.recipe.re_mode
            shapes = [(3, h, w) if mode == "pixel" else (3, 1, 1) for _, _, h, w in boxes]
            noises = erase_noise(noise_seed, shapes) if mode != "const" else [np.zeros(s, np.float32) for s in shapes]
            for (top, left, h, w), noise in zip(boxes, noises):
                patch = torch.from_numpy(noise)
                if not self.normalized:  # uint8 output: the same values, un-normalized
                    patch = ((patch * std + mean) * 255).round_().clamp_(0, 255)
                images[k, :, top:top + h, left:left + w] = patch.to(images.device, images.dtype)
        return images

    # -- mixing: the planned lams and boxes applied -------------------------------------------
    @staticmethod
    def _blend_pair(a: torch.Tensor, b: torch.Tensor, lam: float) -> None:
        """a, b <- lam a + (1 - lam) b, lam b + (1 - lam) a, in place (uint8: rounded)."""
        if a.dtype == torch.uint8:
            fa, fb = a.to(torch.float32), b.to(torch.float32)
            a.copy_(torch.lerp(fa, fb, 1 - lam).round_())
            b.copy_(torch.lerp(fb, fa, 1 - lam).round_())
            return
        kept = a.clone()
        a.lerp_(b, 1 - lam)
        b.lerp_(kept, 1 - lam)

    @staticmethod
    def _swap_box(a: torch.Tensor, b: torch.Tensor, box: tuple[int, int, int, int]) -> None:
        """Exchange the box (top, bottom, left, right) between images a and b, in place."""
        top, bottom, left, right = box
        kept = a[:, top:bottom, left:right].clone()
        a[:, top:bottom, left:right] = b[:, top:bottom, left:right]
        b[:, top:bottom, left:right] = kept

    def _mix_batch(self, images: torch.Tensor, mix: MixupPlan) -> tuple[torch.Tensor, torch.Tensor]:
        """One lam (and box) for the batch; sample i mixed with N-1-i, pair by pair in place (no batch copy)."""
        n, lam, box = len(images), float(mix.lams[0]), mix.boxes[0]
        if lam == 1.0:
            return images, torch.ones(n)
        for i in range(n // 2):
            if box is not None:
                self._swap_box(images[i], images[n - 1 - i], box)
            else:
                self._blend_pair(images[i], images[n - 1 - i], lam)
        return images, torch.from_numpy(mix.lams.copy())

    def _mix_elem(self, images: torch.Tensor, mix: MixupPlan) -> tuple[torch.Tensor, torch.Tensor]:
        """timm's elem mode: a lam (and mixup or cutmix) per sample, each mixed with its partner's
        original pixels."""
        n = len(images)
        original, mixed = images, images.clone()
        for i in range(n):
            j, lam, box = n - 1 - i, float(mix.lams[i]), mix.boxes[i]
            if lam == 1.0:
                continue
            if box is not None:
                top, bottom, left, right = box
                mixed[i, :, top:bottom, left:right] = original[j, :, top:bottom, left:right]
            elif images.dtype == torch.uint8:
                mixed[i] = torch.lerp(original[i].float(), original[j].float(), 1 - lam).round_()
            else:
                mixed[i] = torch.lerp(original[i], original[j], 1 - lam)
        return mixed, torch.from_numpy(mix.lams.copy())
