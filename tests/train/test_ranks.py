"""Several ranks in one run (gloo, spawned processes, each run with a deadline): they agree."""
import pytest

from tests.train.ranks import nan_loss_run, spawn_ranks


@pytest.mark.parametrize("nan_rank, nan_step, log_every", [(0, 2, 2), (1, 3, 50)],
                         ids=["rank0-checked-at-a-log-line", "rank1-checked-at-the-epoch-end"])
def test_a_nan_loss_on_one_rank_stops_every_rank_with_the_same_error(learnable, tmp_path, nan_rank, nan_step,
                                                                    log_every):
    """The old loop: the rank that saw it raised alone, the other died in its next collective
    ("Connection closed by peer"; under NCCL it would wait for the timeout)."""
    outcomes = spawn_ranks(nan_loss_run, 2, learnable, str(tmp_path), nan_rank, nan_step, log_every)
    assert [o.get("error") for o in outcomes] == ["NonFiniteLoss", "NonFiniteLoss"], outcomes
    assert outcomes[0]["message"] == outcomes[1]["message"]
    assert f"in epoch 0 at step {nan_step}" in outcomes[0]["message"]
