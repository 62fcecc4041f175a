"""The batch stage every backend shares, on the output device: random erasing (timm's
RandomErasing, on the normalized images), mixup / cutmix (timm's Mixup, batch or elem mode, the
partner of sample i is sample N-1-i) and label smoothing (soft targets N x classes).

Seeded, never from a global generator: erasing by (seed, epoch, record) through the planner
(datapipe.augment.plan.plan_erase), mixing by (seed, epoch, the batch's position in the epoch, rank),
so a resumed epoch gets exactly the uninterrupted run's batches and targets."""
from __future__ import annotations

import zlib
from typing import Any

import numpy as np
import torch

from .plan import plan_erase
from .recipe import Recipe


def position_key(position: Any) -> int:
    """A stable integer for a plan position (an int, or the shard-wise plan's segments)."""
    if isinstance(position, int):
        return position
    return zlib.crc32(repr(position).encode())


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
            rng = np.random.default_rng([self.seed, epoch, position_key(position), rank, 0x4D4958])
            images, lam = (self._mix_batch if r.mix_mode == "batch" else self._mix_elem)(images, rng)
        return images, self.targets(labels, lam.to(labels.device))

    def targets(self, labels: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
        """timm's mixup_target: smoothed one-hots of each label and of its partner's, mixed by lam."""
        off = self.recipe.label_smoothing / self.num_classes
        on = 1.0 - self.recipe.label_smoothing + off
        def one_hot(y: torch.Tensor) -> torch.Tensor:
            out = torch.full((len(y), self.num_classes), off, device=y.device)
            return out.scatter_(1, y.long().view(-1, 1), on)
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
            generator = np.random.default_rng(noise_seed)
            for top, left, h, w in boxes:
                shape = {"pixel": (3, h, w), "rand": (3, 1, 1), "const": None}[self.recipe.re_mode]
                patch = torch.zeros(3, 1, 1) if shape is None else torch.from_numpy(
                    generator.standard_normal(shape, dtype=np.float32))
                if not self.normalized:  # uint8 output: the same values, un-normalized
                    patch = ((patch * std + mean) * 255).round_().clamp_(0, 255)
                images[k, :, top:top + h, left:left + w] = patch.to(images.device, images.dtype)
        return images

    # -- mixing --------------------------------------------------------------------------------
    def _draw(self, rng: np.random.Generator, count: int | None) -> tuple[np.ndarray, np.ndarray]:
        """timm's _params_per_batch / _params_per_elem: (lambdas, use cutmix) for one or `count` draws."""
        r, n = self.recipe, count or 1
        use_cutmix = np.zeros(n, dtype=bool)
        if r.mixup_alpha > 0 and r.cutmix_alpha > 0:
            use_cutmix = rng.random(n) < r.switch_prob
            lam = np.where(use_cutmix, rng.beta(r.cutmix_alpha, r.cutmix_alpha, n), rng.beta(r.mixup_alpha, r.mixup_alpha, n))
        elif r.mixup_alpha > 0:
            lam = rng.beta(r.mixup_alpha, r.mixup_alpha, n)
        else:
            use_cutmix[:] = True
            lam = rng.beta(r.cutmix_alpha, r.cutmix_alpha, n)
        mixed = rng.random(n) < r.mixup_prob
        return np.where(mixed, lam, 1.0).astype(np.float32), use_cutmix & mixed

    @staticmethod
    def _cut_box(rng: np.random.Generator, lam: float, h: int, w: int) -> tuple[int, int, int, int, float]:
        """timm's rand_bbox + lam correction: (top, bottom, left, right, the lam of the area kept)."""
        ratio = np.sqrt(1 - lam)
        cut_h, cut_w = int(h * ratio), int(w * ratio)
        cy, cx = int(rng.integers(0, h)), int(rng.integers(0, w))
        top, bottom = int(np.clip(cy - cut_h // 2, 0, h)), int(np.clip(cy + cut_h // 2, 0, h))
        left, right = int(np.clip(cx - cut_w // 2, 0, w)), int(np.clip(cx + cut_w // 2, 0, w))
        return top, bottom, left, right, 1.0 - (bottom - top) * (right - left) / float(h * w)

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

    def _mix_batch(self, images: torch.Tensor, rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """One lam for the batch; sample i mixed with N-1-i, pair by pair in place (no batch copy)."""
        lams, cut = self._draw(rng, None)
        lam, n = float(lams[0]), len(images)
        if lam == 1.0:
            return images, torch.ones(n)
        if cut[0]:
            *box, lam = self._cut_box(rng, lam, *images.shape[-2:])
        for i in range(n // 2):
            if cut[0]:
                self._swap_box(images[i], images[n - 1 - i], tuple(box))
            else:
                self._blend_pair(images[i], images[n - 1 - i], lam)
        return images, torch.full((n,), lam)

    def _mix_elem(self, images: torch.Tensor, rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """timm's elem mode: a lam (and mixup or cutmix) per sample, each mixed with its partner's
        original pixels."""
        n = len(images)
        lams, cut = self._draw(rng, n)
        original, mixed = images, images.clone()
        out = torch.ones(n)
        for i in range(n):
            j, lam = n - 1 - i, float(lams[i])
            if lam == 1.0:
                continue
            if cut[i]:
                top, bottom, left, right, lam = self._cut_box(rng, lam, *images.shape[-2:])
                mixed[i, :, top:bottom, left:right] = original[j, :, top:bottom, left:right]
            elif images.dtype == torch.uint8:
                mixed[i] = torch.lerp(original[i].float(), original[j].float(), 1 - lam).round_()
            else:
                mixed[i] = torch.lerp(original[i], original[j], 1 - lam)
            out[i] = lam
        return mixed, out
