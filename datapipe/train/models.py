"""The reference loop's models, by name (`--model`): ResNet-18/34/50/101 (He et al. 2016) without
torchvision, in the torchvision layout, with the last BatchNorm of every residual block initialised to
zero (each block starts as the identity, Goyal et al. 2017); DeiT-Ti/S/B (datapipe.train.vit, timm's
names as aliases); and `timm/NAME` or `torchvision/NAME` built by that package where it is installed.
Activation checkpointing per block for large models."""
from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
from collections.abc import Iterator

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..checks import shown
from .vit import DEIT, check_sizes, deit


def _conv_bn(cin: int, cout: int, k: int, stride: int = 1) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, k, stride, k // 2, bias=False), nn.BatchNorm2d(cout)]


@contextlib.contextmanager
def _running_statistics_kept(norms: list[nn.Module]) -> Iterator[None]:
    """BatchNorm in training mode that leaves its running statistics as they were: momentum 0 makes
    the update running x 1 + batch x 0, and num_batches_tracked is put back. (Passing no running
    buffers instead changes what batch_norm saves for backward, which checkpoint refuses.)"""
    saved = [(m.momentum, m.num_batches_tracked.clone()) for m in norms]
    for m in norms:
        m.momentum = 0.0
    try:
        yield
    finally:
        for m, (momentum, tracked) in zip(norms, saved):
            m.momentum = momentum
            m.num_batches_tracked.copy_(tracked)


def _recompute_contexts(block: nn.Module) -> tuple[contextlib.AbstractContextManager, contextlib.AbstractContextManager]:
    """checkpoint's context_fn: the forward as usual; the recompute in backward without a second
    update of the block's BatchNorm running statistics (it would count every batch twice)."""
    norms = [m for m in block.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats]
    return contextlib.nullcontext(), _running_statistics_kept(norms)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, cin: int, width: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(*_conv_bn(cin, width, 3, stride), nn.ReLU(inplace=True), *_conv_bn(width, width, 3))
        self.shortcut = nn.Sequential(*_conv_bn(cin, width, 1, stride)) if stride != 1 or cin != width else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.shortcut(x))


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin: int, width: int, stride: int) -> None:
        super().__init__()
        cout = width * self.expansion
        self.body = nn.Sequential(*_conv_bn(cin, width, 1), nn.ReLU(inplace=True),
                                  *_conv_bn(width, width, 3, stride), nn.ReLU(inplace=True), *_conv_bn(width, cout, 1))
        self.shortcut = nn.Sequential(*_conv_bn(cin, cout, 1, stride)) if stride != 1 or cin != cout else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.shortcut(x))


class ResNet(nn.Module):
    def __init__(self, block: type[BasicBlock] | type[Bottleneck], layers: list[int], num_classes: int,
                 checkpoint_activations: bool = False) -> None:
        super().__init__()
        self.stem = nn.Sequential(*_conv_bn(3, 64, 7, 2), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1))
        blocks, cin = [], 64
        for stage, (width, count) in enumerate(zip((64, 128, 256, 512), layers)):
            for i in range(count):
                blocks.append(block(cin, width, 2 if i == 0 and stage > 0 else 1))
                cin = width * block.expansion
        self.blocks = nn.ModuleList(blocks)
        self.head = nn.Linear(cin, num_classes)
        self.checkpoint_activations = checkpoint_activations
        self._init_weights()

    def _init_weights(self) -> None:
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        for b in self.blocks:
            nn.init.zeros_(b.body[-1].weight)  # the block's last BN: the block starts as the identity

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for b in self.blocks:
            if self.checkpoint_activations and self.training:
                x = checkpoint(b, x, use_reentrant=False, context_fn=functools.partial(_recompute_contexts, b))
            else:
                x = b(x)
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


ARCHITECTURES = {
    "resnet18": (BasicBlock, [2, 2, 2, 2]),
    "resnet34": (BasicBlock, [3, 4, 6, 3]),
    "resnet50": (Bottleneck, [3, 4, 6, 3]),
    "resnet101": (Bottleneck, [3, 4, 23, 3]),
}
MODELS = (*ARCHITECTURES, *DEIT)
# timm's names of the same architectures (its vit_*_patch16_224 are DeiT's layout: DeiT trained them anew)
ALIASES = {f"{prefix}_{size}_patch16_224": f"deit_{size}" for prefix in ("deit", "vit") for size in ("tiny", "small", "base")}
PACKAGES = ("timm", "torchvision")  # --model PACKAGE/NAME


def resolve_model(name: str) -> str:
    """--model's canonical name (an alias as the name it stands for), or a one-line ValueError: an
    unknown name, or PACKAGE/NAME where that package is not installed. Imports nothing heavy."""
    if not isinstance(name, str):
        raise ValueError(f"model must be a name such as resnet50 or deit_small, got {shown(name)}")
    name = ALIASES.get(name, name)
    if name in MODELS:
        return name
    package, slash, inner = name.partition("/")
    if slash and package in PACKAGES:
        if not inner:
            raise ValueError(f"--model {package}/NAME needs a model name after the slash, e.g. {package}/resnet50")
        if importlib.util.find_spec(package) is None:
            raise ValueError(f"--model {shown(name)} is built by the {package} package, which is not installed: "
                             f"pip install {package}")
        return name
    raise ValueError(f"unknown model {shown(name)}; choose one of {', '.join(MODELS)} (timm's names "
                     f"deit_small_patch16_224, vit_small_patch16_224 ... too), or timm/NAME or torchvision/NAME")


def build_model(name: str, num_classes: int, *, checkpoint_activations: bool = False) -> nn.Module:
    """The model `name` (resolve_model's names) with a head of `num_classes`."""
    name = resolve_model(name)
    if name in DEIT:
        return deit(name, num_classes, checkpoint_activations=checkpoint_activations)
    if "/" in name:
        return _from_package(name, num_classes, checkpoint_activations)
    block, layers = ARCHITECTURES[name]
    return ResNet(block, layers, num_classes, checkpoint_activations)


def check_image_sizes(name: str, sizes: list[int]) -> None:
    """Image sizes the model cannot take, refused before a run starts: a DeiT's must be whole 16 px
    patches. (A timm/ or torchvision/ model checks its own inputs.)"""
    if name in DEIT:
        check_sizes(name, sizes)


def _from_package(name: str, num_classes: int, checkpoint_activations: bool) -> nn.Module:
    """timm.create_model(NAME) or torchvision.models.get_model(NAME), untrained, num_classes outputs."""
    package, _, inner = name.partition("/")
    if checkpoint_activations and package == "torchvision":
        raise ValueError(f"--checkpoint-activations is not available for --model {name}: torchvision's models do "
                         "not offer it (timm's do)")
    try:
        if package == "timm":
            model = importlib.import_module("timm").create_model(inner, num_classes=num_classes)
            if checkpoint_activations:
                model.set_grad_checkpointing(True)
            return model
        return importlib.import_module("torchvision.models").get_model(inner, num_classes=num_classes)
    except (RuntimeError, ValueError, KeyError) as exc:  # their "Unknown model", a bad argument
        raise ValueError(f"--model {shown(name)}: {package} cannot build it ({shown(str(exc), 120)})") from None
