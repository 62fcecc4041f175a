"""`datapipe train` with augmentation recipes: soft targets and their loss, the model EMA, AdamW, the
recipe in the checkpoint, metrics and TensorBoard, and resumes that would change the recipe."""
import copy
import dataclasses
import json
import math

import pytest
import torch
from torch import nn

from datapipe.augment import PRESETS
from datapipe.cli.main import build_parser, main
from datapipe.cli.recipe import train_recipe
from datapipe.train import Trainer, TrainConfig, train
from datapipe.train.checkpoint import load
from datapipe.train.config import warmup_cosine
from datapipe.train.ema import ModelEma
from datapipe.train.models import build_model
from datapipe.train.objective import count_correct
from datapipe.train.optim import build_optimizer
from tests.converters.faults import run_datapipe
from tests.train.support import config, strict_json_lines

SMALL = ["--model", "resnet18", "--image-size", "32", "--batch-size", "12", "--workers", "1", "--backend", "dataloader"]


@pytest.fixture(scope="module")
def deit_run(learnable, tmp_path_factory):
    """One epoch of `datapipe train --recipe deit --opt adamw --model-ema` (6 steps at 32 px)."""
    out = tmp_path_factory.mktemp("deit")
    assert main(["train", learnable, *SMALL, "--epochs", "1", "--recipe", "deit", "--opt", "adamw", "--model-ema",
                 "--out", str(out)]) == 0
    return out


def test_the_cli_trains_an_epoch_of_the_deit_recipe_and_records_it(deit_run):
    metrics = strict_json_lines(deit_run / "metrics.jsonl")
    assert len(metrics) == 1 and metrics[0]["recipe"] == "deit" and metrics[0]["steps"] == 6
    assert math.isfinite(metrics[0]["train_loss"]) and 0 <= metrics[0]["train_acc"] <= 1
    assert metrics[0]["val_acc"] is not None and metrics[0]["ema_val_acc"] is not None
    saved = load(deit_run / "last.pt")
    assert saved["recipe"] == saved["config"]["recipe"] == saved["loader"]["recipe"] == PRESETS["deit"].to_dict()
    assert saved["config"]["opt"] == "adamw" and saved["config"]["model_ema"] is True
    assert {"exp_avg", "exp_avg_sq"} <= set(saved["optimizer"]["state"][0])  # AdamW's state, not SGD's
    assert saved["model_ema"].keys() == saved["model"].keys()
    summary = json.loads((deit_run / "summary.json").read_text())
    assert summary["recipe"] == PRESETS["deit"].to_dict() and summary["opt"] == "adamw"


def test_the_recipe_is_in_tensorboards_hparams(deit_run):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    events = EventAccumulator(str(deit_run / "tensorboard"))
    events.Reload()
    content = events.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    found = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info.hparams
    assert found["recipe"].string_value == "deit" and found["opt"].string_value == "adamw"
    assert found["recipe/mixup_alpha"].number_value == 0.8 and found["recipe/re_mode"].string_value == "pixel"
    assert found["model_ema"].number_value == 1 and found["lr"].number_value == pytest.approx(1e-3)


@pytest.mark.parametrize("change, said", [
    (["--recipe", "tv-v2"], "it was trained with recipe 'deit', this run asks for 'tv-v2'"),
    (["--mixup", "0.5"], "mixup_alpha: 0.8 != 0.5"),
    (["--opt", "sgd"], "it was trained with --opt adamw, this run asks for --opt sgd"),
])
def test_a_resume_that_changes_the_recipe_or_optimizer_is_refused_in_one_line(learnable, deit_run, change, said):
    done = run_datapipe(["train", learnable, "--out", str(deit_run),
                         "--resume", str(deit_run / "last.pt"), *change])
    assert done.returncode == 2 and "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"datapipe train: error: cannot resume from {deit_run / 'last.pt'}: ") and said in last


def test_soft_target_loss_and_accuracy_equal_a_hand_computation(learnable, tmp_path):
    trainer = Trainer(config(learnable, tmp_path, epochs=1, recipe="deit"))
    logits = torch.tensor([[2.0, 0.0, -1.0], [0.5, 1.5, 0.0]])
    target = torch.tensor([[0.7, 0.2, 0.1], [0.0, 0.4, 0.6]])
    by_hand = 0.0
    for row, probs in zip(logits.tolist(), target.tolist()):
        log_sum = math.log(sum(math.exp(v) for v in row))
        by_hand -= sum(p * (v - log_sum) for p, v in zip(probs, row))
    assert trainer.criterion(logits, target).item() == pytest.approx(by_hand / 2, rel=1e-6)
    assert count_correct(logits, target).item() == 1  # argmax 0 == 0; argmax 1 != 2
    assert count_correct(logits, torch.tensor([0, 1])).item() == 2


def test_a_smoothing_recipes_targets_are_not_smoothed_again_and_integer_labels_still_are(learnable, tmp_path):
    """ffcv-rn50 smooths by 0.1 in its soft targets: the loss is their plain cross-entropy. The default
    recipe yields integer labels, which the loss smooths by 0.1 as before recipes: the same value."""
    trainer = Trainer(config(learnable, tmp_path / "ffcv", epochs=1, recipe="ffcv-rn50"))
    images, labels, _ = next(iter(trainer.loader))
    assert labels.shape == (12, 3) and labels.max().item() == pytest.approx(1 - 0.1 + 0.1 / 3)
    logits = torch.randn(12, 3)
    plain = torch.sum(-labels * torch.log_softmax(logits, -1), -1).mean()
    assert trainer.criterion(logits, labels).item() == pytest.approx(plain.item(), rel=1e-6)
    smoothed_twice = nn.CrossEntropyLoss(label_smoothing=0.1)(logits, labels)
    assert trainer.criterion(logits, labels).item() != pytest.approx(smoothed_twice.item(), rel=1e-4)
    hard = Trainer(config(learnable, tmp_path / "default", epochs=1)).criterion(logits, labels.argmax(1))
    assert hard.item() == pytest.approx(plain.item(), rel=1e-5)


def test_label_smoothing_and_a_soft_target_recipe_are_one_value_or_an_error(learnable, tmp_path):
    assert config(learnable, tmp_path).loss_smoothing == 0.1  # unset: the loop's historical 0.1
    assert config(learnable, tmp_path, label_smoothing=0.2).loss_smoothing == 0.2
    assert config(learnable, tmp_path, label_smoothing=0.1, recipe="deit").recipe.label_smoothing == 0.1
    with pytest.raises(ValueError, match=r"label_smoothing=0.2 smooths integer labels .* recipe 'deit' .*--smoothing 0.2"):
        config(learnable, tmp_path, label_smoothing=0.2, recipe="deit")
    done = run_datapipe(["train", learnable, "--out", str(tmp_path), "--recipe", "deit", "--label-smoothing", "0.2"])
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("datapipe train: error: label_smoothing=0.2 smooths")


def test_recipe_flags_change_the_fields_they_name():
    def recipe(*flags):
        return train_recipe(build_parser().parse_args(["train", "data", "--out", "o", *flags]), {})

    assert recipe() is None  # nothing given: TrainConfig's default (or, on --resume, the checkpoint's)
    r = recipe("--recipe", "deit", "--aa", "none", "--mixup", "0.5", "--cutmix", "0", "--mixup-prob", "0.8",
               "--mixup-switch-prob", "0.3", "--mixup-mode", "elem", "--reprob", "0.5", "--remode", "const",
               "--recount", "2", "--smoothing", "0.2", "--crop-pct", "0.9", "--interpolation", "bilinear",
               "--hflip", "0.25", "--color-jitter", "0.3", "--scale", "0.35", "1")
    assert (r.auto_augment, r.mixup_alpha, r.cutmix_alpha, r.mixup_prob, r.switch_prob, r.mix_mode) == (
        None, 0.5, 0.0, 0.8, 0.3, "elem")
    assert (r.re_prob, r.re_mode, r.re_count, r.label_smoothing, r.crop_pct) == (0.5, "const", 2, 0.2, 0.9)
    assert (r.interpolation, r.eval_interpolation, r.hflip, r.color_jitter, r.scale) == (
        "bilinear", "bilinear", 0.25, (0.3, 0.3, 0.3), (0.35, 1.0))
    assert r.name == "deit+" and r.re_prob == 0.5
    assert recipe("--interpolation", "bicubic", "--train-interpolation", "random").interpolation == "random"
    assert recipe("--aa", "rand-m6-mstd0.5-inc1").auto_augment == "rand-m6-mstd0.5-inc1"
    saved = {"recipe": PRESETS["tv-v2"]}  # on --resume: the flags change the checkpoint's recipe
    args = build_parser().parse_args(["train", "d", "--out", "o", "--reprob", "0"])
    assert train_recipe(args, saved) == dataclasses.replace(PRESETS["tv-v2"], re_prob=0.0)


def test_ema_follows_the_decay_formula_and_differs_from_the_model():
    torch.manual_seed(0)
    model = nn.Sequential(nn.BatchNorm1d(4), nn.Linear(4, 3))
    ema = ModelEma(model, decay=0.75)
    before = copy.deepcopy(model.state_dict())
    model(torch.randn(8, 4)).square().sum().backward()  # also moves BatchNorm's running statistics
    torch.optim.SGD(model.parameters(), lr=0.5).step()
    ema.update(model)
    after = model.state_dict()
    for name, value in ema.state_dict().items():
        if value.is_floating_point():
            assert torch.allclose(value, 0.75 * before[name] + 0.25 * after[name]), name
            assert not torch.allclose(value, after[name]), name
        else:
            assert torch.equal(value, after[name]), name  # num_batches_tracked: copied
    assert not any(p.requires_grad for p in ema.module.parameters()) and not ema.module.training


def test_the_trainers_ema_takes_one_step_saves_it_and_resumes_it(learnable, tmp_path):
    run = config(learnable, tmp_path, epochs=1, model_ema=True, model_ema_decay=0.5, max_steps=1)
    trainer = Trainer(run)
    initial = copy.deepcopy(trainer.model.state_dict())
    trainer.fit()
    saved = load(tmp_path / "last.pt")
    for name, value in saved["model_ema"].items():
        if value.is_floating_point():
            assert torch.allclose(value, 0.5 * initial[name] + 0.5 * saved["model"][name], atol=1e-6), name
    assert any(not torch.equal(v, saved["model"][k]) for k, v in saved["model_ema"].items())
    metrics = train(dataclasses.replace(run, max_steps=None, resume=str(tmp_path / "last.pt")))
    assert metrics[0]["ema_val_acc"] is not None and metrics[0]["steps"] == 6


def test_adamw_decays_weights_only_and_takes_its_own_defaults():
    model = build_model("resnet18", 3)
    cfg = TrainConfig(data="d", out="o", opt="adamw")
    assert (cfg.lr, cfg.weight_decay) == (1e-3, 0.05)
    assert (TrainConfig(data="d", out="o").lr, TrainConfig(data="d", out="o").weight_decay) == (0.1, 1e-4)
    optimizer = build_optimizer(model, cfg)
    assert isinstance(optimizer, torch.optim.AdamW)
    decay, rest = optimizer.param_groups
    assert (decay["weight_decay"], rest["weight_decay"], decay["lr"]) == (0.05, 0.0, 1e-3)
    names = {id(p): n for n, p in model.named_parameters()}
    assert len(decay["params"]) + len(rest["params"]) == len(names)
    assert all(p.ndim > 1 for p in decay["params"]) and "head.weight" in {names[id(p)] for p in decay["params"]}
    assert all(p.ndim == 1 for p in rest["params"]) and "head.bias" in {names[id(p)] for p in rest["params"]}
    assert isinstance(build_optimizer(model, TrainConfig(data="d", out="o")), torch.optim.SGD)


def test_warmup_lr_and_min_lr_bound_the_schedule():
    assert warmup_cosine(0, warmup=4, total=10, start=0.2) == pytest.approx(0.2 + 0.8 / 4)
    assert warmup_cosine(10, warmup=4, total=10, floor=0.1) == pytest.approx(0.1)
    assert warmup_cosine(7, warmup=4, total=10, floor=0.1) == pytest.approx(0.1 + 0.9 * 0.5)
    assert warmup_cosine(2, warmup=4, total=10) == 3 / 4  # the historical schedule unchanged
    with pytest.raises(ValueError, match=r"min_lr \(0.5\) and warmup_lr \(0.0\) must be within 0..lr \(0.1\)"):
        TrainConfig(data="d", out="o", min_lr=0.5)
