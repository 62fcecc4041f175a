"""An s3:// dataset (moto on loopback) read by ranks that trainers start, each with 2 DataLoader
workers: the rank reads the manifest, then its workers read the shards. A process that made an
obstore request must not fork a worker that makes one (it hangs): Accelerate's ranks under torchrun
and spawned Lightning ranks, whose workers are forked."""
from __future__ import annotations

from pathlib import Path

import pytest

from datapipe import open_dataset
from tests.conftest import installed
from tests.storage.conftest import upload_folder
from tests.trainers.served import check_epochs, run_script

TRAINERS = Path(__file__).parents[1] / "trainers"


# None: the workers start as the rank did (spawned); both in make test-rest and CI: make test reads S3 from ranks
# whose workers are forked in test_an_s3_dataset_under_accelerate_with_two_workers_per_rank
@pytest.mark.parametrize("start_method", [pytest.param(None, marks=pytest.mark.full),
                                          pytest.param("fork", marks=pytest.mark.full)])
def test_an_s3_dataset_under_lightning_ddp_spawn_with_two_workers_per_rank(s3, packed_wds, tmp_path, start_method):
    if not installed("pytorch_lightning"):  # found, not imported: the ranks import it, not this process
        pytest.skip("pytorch_lightning is not installed")
    url = s3.bucket("lightning-spawn") + "/fixture.wds"
    upload_folder(packed_wds, url)
    args = ["--strategy", "ddp_spawn", "--workers", "2", "--epochs", "2"]
    ranks = run_script(TRAINERS / "lightning_run.py", url, tmp_path / "run",
                       *args, *(["--start-method", start_method] if start_method else []), timeout=150)
    check_epochs(ranks, len(open_dataset(packed_wds)), 2)


def test_an_s3_dataset_under_accelerate_with_two_workers_per_rank(s3, packed_wds, tmp_path):
    if not installed("accelerate"):  # found, not imported: the ranks import it, not this process
        pytest.skip("accelerate is not installed")
    url = s3.bucket("accelerate-fork") + "/fixture.wds"
    upload_folder(packed_wds, url)
    ranks = run_script(TRAINERS / "accelerate_run.py", url, tmp_path / "run", "--workers", "2", "--epochs", "2",
                       timeout=150)
    check_epochs(ranks, len(open_dataset(packed_wds)), 2)
