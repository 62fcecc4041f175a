"""DeiT-Ti/S/B in the reference loop (#48 row 12: `--model vit_small_patch16_224` was refused,
resnet18/34/50/101 only): timm's sizes exactly, timm's names as aliases, the position table resampled
for other image sizes, no weight decay on it, a real `datapipe train --model deit_tiny --recipe deit`
run on the CPU, and `--model timm/NAME` / `torchvision/NAME` refused in one line naming the package
where it is not installed."""
import math
import sys

import pytest
import torch

from datapipe.cli.main import main
from datapipe.train import TrainConfig, build_model
from datapipe.train.optim import param_groups
from datapipe.train.vit import GRID, resample_positions
from tests.train.support import strict_json_lines

# timm 1.0's deit_{tiny,small,base}_patch16_224 at 1000 classes (published: 5.7M, 22.1M, 86.6M)
TIMM_PARAMETERS = {"deit_tiny": 5_717_416, "deit_small": 22_050_664, "deit_base": 86_567_656}
PUBLISHED = {"deit_tiny": 5.7e6, "deit_small": 22.1e6, "deit_base": 86.6e6}
SMALL = ["--image-size", "32", "--batch-size", "12", "--workers", "0", "--backend", "dataloader", "--tensorboard", "off"]


@pytest.mark.parametrize("name", sorted(TIMM_PARAMETERS))
def test_deit_has_timms_parameter_count_at_224(name):
    model = build_model(name, 1000)
    count = sum(p.numel() for p in model.parameters())
    assert count == TIMM_PARAMETERS[name]
    assert round(count / 1e5) == round(PUBLISHED[name] / 1e5)  # the paper's and timm's table, to 0.1M
    assert model(torch.randn(1, 3, 224, 224)).shape == (1, 1000)


@pytest.mark.parametrize("alias, name", [("deit_tiny_patch16_224", "deit_tiny"), ("vit_small_patch16_224", "deit_small"),
                                         ("deit_base_patch16_224", "deit_base"), ("deit_small", "deit_small")])
def test_timms_names_are_aliases(alias, name, tmp_path):
    assert TrainConfig(data="d", out=str(tmp_path), model=alias).model == name


def test_other_image_sizes_resample_the_position_table():
    """32 px: 2 x 2 patches, the 14 x 14 table resampled (the class token's entry kept); 224 px: as it is."""
    model = build_model("deit_tiny", 3).eval()
    table = model.pos_embed.detach()
    small = resample_positions(table, (2, 2))
    assert small.shape == (1, 1 + 4, 192) and torch.equal(small[:, 0], table[:, 0])
    assert resample_positions(table, (GRID, GRID)) is table
    with torch.no_grad():
        for size in (32, 48, 224):
            assert torch.isfinite(model(torch.randn(2, 3, size, size))).all()


def test_image_sizes_that_are_not_whole_patches_are_refused_in_one_line(learnable, tmp_path, capsys):
    assert main(["train", learnable, "--model", "deit_tiny", *SMALL, "--image-size", "40", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [err] and "image size 40 is not a multiple of 16" in err and "(e.g. 48)" in err


def test_the_position_table_and_class_token_are_not_decayed():
    model = build_model("deit_tiny", 3)
    decay, rest = param_groups(model, 0.05)
    names = {id(p): n for n, p in model.named_parameters()}
    undecayed = {names[id(p)] for p in rest["params"]}
    assert {"pos_embed", "cls_token"} <= undecayed
    assert {names[id(p)] for p in decay["params"]} == {n for n, p in model.named_parameters()
                                                     if p.ndim > 1 and n not in ("pos_embed", "cls_token")}


def test_activation_checkpointing_changes_nothing_but_memory():
    def one_step(checkpoint_activations: bool) -> dict[str, torch.Tensor]:
        torch.manual_seed(0)
        model = build_model("deit_tiny", 3, checkpoint_activations=checkpoint_activations)
        images = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        torch.nn.functional.cross_entropy(model(images), torch.tensor([0, 1, 2, 0])).backward()
        optimizer.step()
        return model.state_dict()

    plain, recomputed = one_step(False), one_step(True)
    for name in plain:
        assert torch.allclose(recomputed[name], plain[name], atol=1e-6), name


def test_datapipe_train_trains_deit_tiny_with_the_deit_recipe_on_the_cpu(learnable, tmp_path):
    """A real run: 2 steps at 32 px (2 x 2 patches), AdamW; loss finite, metrics.jsonl written."""
    assert main(["train", learnable, "--model", "deit_tiny", "--recipe", "deit", "--opt", "adamw", "--max-steps", "2",
                 *SMALL, "--out", str(tmp_path)]) == 0
    (line,) = strict_json_lines(tmp_path / "metrics.jsonl")
    assert line["steps"] == 2 and line["images"] == 24 and line["recipe"] == "deit" and line["partial"] is True
    assert math.isfinite(line["train_loss"]) and line["train_loss"] > 0 and 0 <= line["data_wait_pct"] <= 100


@pytest.mark.parametrize("package, name", [("timm", "timm/vit_small_patch16_224"), ("torchvision", "torchvision/resnet50")])
def test_a_package_model_without_its_package_is_one_line_naming_it(package, name, learnable, tmp_path, capsys,
                                                                    monkeypatch):
    monkeypatch.setitem(sys.modules, package, None)  # not installed, as find_spec and import see it, on any machine
    assert main(["train", learnable, "--model", name, *SMALL, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"datapipe train: error: --model '{name}' is built by the {package} package, which is not " \
                  f"installed: pip install {package}"
    assert not tmp_path.exists() or not any(tmp_path.iterdir())


@pytest.mark.parametrize("name", ["vgg16", "timm/", "\x1b[2Jresnet50", "x" * 5000])
def test_an_unknown_model_is_one_line(name, learnable, tmp_path, capsys):
    assert main(["train", learnable, "--model", name, *SMALL, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [err] and len(err) < 400 and "\x1b" not in err and "model" in err
