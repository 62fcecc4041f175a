"""DeiT-Ti/S/B (Touvron et al. 2021) as timm's VisionTransformer defines them, in plain torch: 16 px
patches, a class token, a learned position table for 224 px (14 x 14 patches), 12 pre-norm blocks
(LayerNorm eps 1e-6, attention through scaled_dot_product_attention, an MLP of 4 x the width), a
final LayerNorm and a linear head on the class token. timm's parameter counts at 224 px, 1000
classes: 5,717,416 / 22,050,664 / 86,567,656.

Other image sizes: the position table (of the 224 px grid) is resampled bicubically to the input's
grid at each forward, as timm's dynamic_img_size does (resample_abs_pos_embed), so the parameters
never depend on the run's image sizes and a progressive-resizing or FixRes run keeps one model. The
image side must be a multiple of the patch (16): check_sizes says so before a run starts. The modules
are named as timm's, so a timm DeiT state_dict loads as it is."""
from __future__ import annotations

from collections import OrderedDict

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

PATCH = 16
GRID = 224 // PATCH  # the position table's grid: timm's *_patch16_224
# name: (width, heads); depth 12 and MLP ratio 4 for all three (timm's deit_{tiny,small,base}_patch16_224)
DEIT = {"deit_tiny": (192, 3), "deit_small": (384, 6), "deit_base": (768, 12)}
DEPTH, MLP_RATIO, EPS = 12, 4, 1e-6


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, dim = x.shape
        q, k, v = self.qkv(x).reshape(batch, tokens, 3, self.heads, dim // self.heads).permute(2, 0, 3, 1, 4)
        x = F.scaled_dot_product_attention(q, k, v)
        return self.proj(x.transpose(1, 2).reshape(batch, tokens, dim))


class Block(nn.Module):
    """x + attn(norm1(x)), then x + mlp(norm2(x)): timm's pre-norm block (no layer scale, no drop path)."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=EPS)
        self.attn = Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim, eps=EPS)
        self.mlp = nn.Sequential(OrderedDict(fc1=nn.Linear(dim, dim * MLP_RATIO), act=nn.GELU(),
                                             fc2=nn.Linear(dim * MLP_RATIO, dim)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


def resample_positions(table: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """The (1, 1 + GRID^2, dim) table with its patch part resampled to `grid` as timm's
    resample_abs_pos_embed does (bicubic, antialiased, in float32); the class token's entry as it is."""
    if grid == (GRID, GRID):
        return table
    cls, patches = table[:, :1], table[:, 1:]
    dim = table.shape[-1]
    patches = patches.reshape(1, GRID, GRID, dim).permute(0, 3, 1, 2)
    patches = F.interpolate(patches.float(), size=grid, mode="bicubic", antialias=True).to(table.dtype)
    return torch.cat([cls, patches.permute(0, 2, 3, 1).reshape(1, grid[0] * grid[1], dim)], dim=1)


class VisionTransformer(nn.Module):
    def __init__(self, dim: int, heads: int, num_classes: int, checkpoint_activations: bool = False) -> None:
        super().__init__()
        self.patch_embed = nn.ModuleDict({"proj": nn.Conv2d(3, dim, PATCH, PATCH)})
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, 1 + GRID * GRID, dim))
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(DEPTH))
        self.norm = nn.LayerNorm(dim, eps=EPS)
        self.head = nn.Linear(dim, num_classes)
        self.checkpoint_activations = checkpoint_activations
        self._init_weights()

    def _init_weights(self) -> None:
        """timm's default ('' mode): position table trunc-normal 0.02, class token normal 1e-6, linear
        layers trunc-normal 0.02 with zero biases, LayerNorm ones and zeros; the patch conv torch's."""
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        nn.init.normal_(self.cls_token, std=1e-6)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias)

    def no_weight_decay(self) -> set[str]:
        """Parameters never decayed, as timm's VisionTransformer.no_weight_decay (datapipe.train.optim)."""
        return {"pos_embed", "cls_token"}

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed["proj"](images)  # N, dim, H/16, W/16
        grid = (x.shape[-2], x.shape[-1])
        x = x.flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(len(x), -1, -1), x], dim=1) + resample_positions(self.pos_embed, grid)
        for block in self.blocks:
            if self.checkpoint_activations and self.training:
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        return self.head(self.norm(x)[:, 0])


def deit(name: str, num_classes: int, *, checkpoint_activations: bool = False) -> VisionTransformer:
    dim, heads = DEIT[name]
    return VisionTransformer(dim, heads, num_classes, checkpoint_activations)


def check_sizes(model: str, sizes: list[int]) -> None:
    """A ViT sees whole patches: every train and eval size a multiple of the patch, as timm's PatchEmbed
    requires ("Input height should be divisible by patch size")."""
    bad = sorted({s for s in sizes if s % PATCH})
    if bad:
        near = -(-bad[0] // PATCH) * PATCH  # the next whole number of patches
        raise ValueError(f"--model {model} cuts images into {PATCH} px patches: image size {bad[0]} is not a multiple "
                         f"of {PATCH}; give --image-size/--eval-size multiples of {PATCH} (e.g. {near})")

