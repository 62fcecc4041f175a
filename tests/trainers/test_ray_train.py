"""Ray Train with the real library (TorchTrainer, 2 CPU workers, gloo, a local Ray on loopback):
docs/examples/ray_train.py's workers, training over a datapipe.Mix (tests/trainers/mixed.py), fail after
6 steps (mid-epoch, after a checkpoint), Ray Train starts them again and they resume from
ray.train.get_checkpoint(); ray.train.torch.prepare_data_loader given a loader over one dataset. (Ray
Train keeps the world size of its ScalingConfig across the restart.)"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import installed

if not installed("ray.train"):  # found, not imported: no pytest worker imports it at collection
    pytest.skip("ray[train] is not installed", allow_module_level=True)

from tests.converters.test_ray import local_ray  # noqa: E402,F401  (module-scoped Ray on 127.0.0.1)
from tests.processes import deadline  # noqa: E402
from tests.trainers.mixed import data_of, mix_spec  # noqa: E402
from tests.trainers.reference import EPOCHS, check_mix_coverage, each_once, unbroken  # noqa: E402
from tests.trainers.served import MID_STEP, STEPS_PER_EPOCH  # noqa: E402

EXAMPLES = Path(__file__).parents[2] / "docs" / "examples"
FIT_S = 240


@pytest.fixture(scope="module")
def mix(packed_lmdb, packed_wds):
    return data_of(mix_spec(packed_lmdb, packed_wds))


@pytest.fixture(scope="module")
def run(local_ray, mix, packed_lmdb, tmp_path_factory):  # noqa: F811
    """One TorchTrainer run over the mix: its workers fail after MID_STEP (mid-epoch) and Ray Train
    starts them again; its result, what each rank trained on, and what the probe found (over LMDB)."""
    import ray.train
    from ray.train.torch import TorchTrainer

    from tests.trainers.ray_run import interrupted_once

    audit, storage = tmp_path_factory.mktemp("ray-audit"), tmp_path_factory.mktemp("ray-storage")
    config = {"data": mix, "probe_data": str(packed_lmdb), "epochs": EPOCHS, "batch_size": 4, "image_size": 8,
              "model": "linear", "max_steps": None, "audit": str(audit), "stop_at": MID_STEP}
    trainer = TorchTrainer(interrupted_once, train_loop_config=config,
                           scaling_config=ray.train.ScalingConfig(num_workers=2, use_gpu=False),
                           run_config=ray.train.RunConfig(name="run", storage_path=str(storage),
                                                          failure_config=ray.train.FailureConfig(max_failures=1)))
    with pytest.MonkeyPatch.context() as env, deadline(FIT_S):
        env.setenv("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2")  # how often the controller polls (2 s by default)
        result = trainer.fit()
    trained = {rank: [json.loads(line) for line in (audit / f"rank{rank}.jsonl").read_text().splitlines()]
               for rank in (0, 1)}
    probes = {rank: json.loads((audit / f"probe-rank{rank}.json").read_text()) for rank in (0, 1)}
    return result, trained, probes


@pytest.fixture(scope="module")
def reference(packed_lmdb):
    return unbroken(packed_lmdb)


@pytest.fixture(scope="module")
def mix_reference(mix):
    return unbroken(mix)


def test_the_page_quotes_the_example_whole():
    assert (EXAMPLES / "ray_train.py").read_text().rstrip("\n") in (EXAMPLES.parent / "trainers.md").read_text()


def test_get_checkpoint_resumes_mid_epoch_and_every_batch_is_trained_once(run, mix_reference, mix):
    """Each step's records are the unbroken loader's batch there, whose (source, record, label) are
    the mix's uninterrupted sequence; every batch once, none twice. (The example's audit writes the
    indices inside each source; the sources and labels are the yardstick's.)"""
    reference = mix_reference
    result, trained, _ = run
    assert result.error is None and result.metrics["step"] == EPOCHS * STEPS_PER_EPOCH
    check_mix_coverage(reference, mix)
    steps = []
    for rank, records in trained.items():
        assert [r["step"] for r in records] == list(range(1, EPOCHS * STEPS_PER_EPOCH + 1))  # no step twice
        for r in records:
            batch = (rank, r["epoch"], r["step"] - r["epoch"] * STEPS_PER_EPOCH)
            assert r["indices"] == reference[batch][0], batch
            steps.append(batch)
    each_once(steps, reference)


def test_prepare_data_loader_refuses_in_one_line_or_hands_the_loader_back(run):
    for found in run[2].values():
        assert "not a torch DataLoader" in found["refused"] and "\n" not in found["refused"]
        assert found["unchanged"] is True


def test_a_state_taken_through_rays_read_ahead_wrapper_counts_the_batch_it_holds(run, reference):
    """The rule docs/trainers.md states: in step k under a wrapper holding h batches, state_dict()
    counts k + h; resumed from it, the loader serves batch k + h + 1 (here k=1, h=1)."""
    for rank, found in run[2].items():
        assert found["len"] == STEPS_PER_EPOCH and found["first"] == reference[rank, 0, 1][0]
        assert found["batches_done"] == 2 and found["resumed_first"] == reference[rank, 0, 3][0]
