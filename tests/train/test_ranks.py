"""Several ranks in one run (gloo, spawned processes, each run with a deadline): they agree."""
import pytest

from datapipe.train import train
from tests.train.ranks import nan_loss_run, spawn_ranks, train_run
from tests.train.support import config


@pytest.mark.parametrize("nan_rank, nan_step, log_every", [(0, 2, 2), pytest.param(1, 3, 50, marks=pytest.mark.full)],
                         ids=["rank0-checked-at-a-log-line", "rank1-checked-at-the-epoch-end"])
def test_a_nan_loss_on_one_rank_stops_every_rank_with_the_same_error(learnable, tmp_path, nan_rank, nan_step,
                                                                    log_every):
    """The old loop: the rank that saw it raised alone, the other died in its next collective
    ("Connection closed by peer"; under NCCL it would wait for the timeout)."""
    outcomes = spawn_ranks(nan_loss_run, 2, learnable, str(tmp_path), nan_rank, nan_step, log_every)
    assert [o.get("error") for o in outcomes] == ["NonFiniteLoss", "NonFiniteLoss"], outcomes
    assert outcomes[0]["message"] == outcomes[1]["message"]
    assert f"in epoch 0 at step {nan_step}" in outcomes[0]["message"]


@pytest.mark.parametrize("before, after", [(2, 1), pytest.param(1, 2, marks=pytest.mark.full)])
def test_an_elastic_resume_counts_every_image_of_the_epoch_once(learnable, tmp_path, before, after):
    """72 images at batch 6, stopped after 2 steps on `before` ranks (12 images each), finished on
    `after` ranks: the epoch's record counts the 72 once (the old loop: 60 or 84)."""
    options = dict(epochs=1, batch_size=6)

    def run(world_size, **more):
        if world_size == 1:
            return train(config(learnable, tmp_path, **options, **more))
        outcomes = spawn_ranks(train_run, world_size, learnable, str(tmp_path), {**options, **more})
        assert all("result" in o for o in outcomes), outcomes
        return outcomes[0]["result"]

    assert run(before, max_steps=2) == []
    metrics = run(after, resume=str(tmp_path / "last.pt"))
    assert [(m["epoch"], m["world_size"], m["images"]) for m in metrics] == [(0, after, 72)]
