"""A record's plan is drawn in one planner call, and every backend uses the same plans.

The planner (datapipe.augment.plan.plan_sample) is wrapped to append each plan it returns to a file
(appends of one line: the dataloader's and DALI's forked worker processes report too). Each backend
serves one epoch; the log must hold exactly one plan per served record, and the plans must be the
same in every backend, per record, for every preset.
"""
from __future__ import annotations

import base64
import os
import pickle

import pytest
import torch

from datapipe import make_loader, open_dataset
from datapipe.augment import PRESETS, Recipe
from datapipe.augment import plan as planner
from datapipe.order.sharding import record_of

BACKENDS = ["threads", "dataloader", "prefetch", "dali"]
RECIPES = {**PRESETS, "hue": Recipe(color_jitter=(0.4, 0.4, 0.4, 0.3), grayscale_prob=0.2),
           "w0": Recipe(auto_augment="rand-m9-n3-mstd0.5-inc1-w0", vflip=0.5),
           "augmix": Recipe(auto_augment="augmix-m5-w3", grayscale_prob=0.3)}
SMALL = dict(batch_size=4, image_size=32, num_workers=2, seed=5, dtype=torch.uint8)


@pytest.fixture
def plan_log(monkeypatch, tmp_path):
    """The path of the file every plan_sample call (in this process or a forked worker) appends to."""
    path = tmp_path / "plans.log"
    real = planner.plan_sample

    def recording(recipe, seed, epoch, key, size, width, height, *, train=True):
        plan = real(recipe, seed, epoch, key, size, width, height, train=train)
        line = base64.b64encode(pickle.dumps((epoch, key, size, plan))) + b"\n"
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)
        return plan

    monkeypatch.setattr(planner, "plan_sample", recording)
    return path


def read_plans(path) -> list[tuple]:
    if not path.exists():
        return []
    return [pickle.loads(base64.b64decode(line)) for line in path.read_bytes().splitlines()]


def served_epoch(dataset, backend: str, recipe, plan_log, *, train: bool = True) -> tuple[list[int], list[tuple]]:
    """(the record indices one epoch served, the plans drawn meanwhile), the log emptied first."""
    if backend == "dali":
        pytest.importorskip("nvidia.dali")
    options = dict(device="cpu") if backend == "dali" else {}
    loader = make_loader(dataset, backend=backend, recipe=recipe, train=train, split="train", **SMALL, **options)
    loader.set_epoch(1)
    plan_log.unlink(missing_ok=True)
    keys = [int(i) for batch in loader for i in batch.indices]
    return keys, read_plans(plan_log)


@pytest.mark.parametrize("backend", BACKENDS)
def test_each_backend_draws_one_plan_per_record(packed_lmdb, backend, plan_log, within):
    """One planner call per served record, no more (no second draw for the ops, the view or the
    transform), no fewer (no backend drawing on its own); in the train and the eval view. DeiT's
    repeated augmentation serves each record 3 times, each repeat under a key of its own."""
    count = len(open_dataset(packed_lmdb))
    for train in (True, False):
        served, plans = served_epoch(packed_lmdb, backend, PRESETS["deit"], plan_log, train=train)
        assert len(served) >= 8
        assert sorted(record_of(key, count) for _, key, _, _ in plans) == sorted(served), (backend, train)
        assert len({key for _, key, _, _ in plans}) == len(plans)
        assert {(epoch, size) for epoch, _, size, _ in plans} == {(1, 32)}
        assert all((plan.crop is not None) == train for *_, plan in plans)


@pytest.mark.parametrize("preset", sorted(RECIPES))
def test_every_backend_uses_the_same_plan_per_record(packed_lmdb, preset, plan_log, within):
    """The ★ property by construction: per record, the plan each backend drew is the same value
    (every preset, hue jitter, weighted RandAugment)."""
    used = {}
    for backend in BACKENDS:
        _, plans = served_epoch(packed_lmdb, backend, RECIPES[preset], plan_log)
        used[backend] = {key: plan for _, key, _, plan in plans}
        assert len(used[backend]) == len(plans) >= 8  # one plan per record
    reference = used["threads"]
    assert any(plan.ops for plan in reference.values()) or preset in ("default", "ffcv-rn50")
    for backend, plans in used.items():
        assert plans == reference, backend
