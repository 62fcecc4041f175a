"""The example scripts of docs/trainers.md: the page quotes each one whole, and each runs on 2 CPU
ranks with the real library, then resumes from what it saved and trains only the epoch left."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from tests.conftest import installed
from tests.trainers.served import run_to_end

DOCS = Path(__file__).parents[2] / "docs"
EXAMPLES = DOCS / "examples"
SMALL = ["--batch-size", "4", "--image-size", "32"]
TIMEOUT_S = 240


def torchrun(script: Path, *args: str) -> str:
    return run_to_end([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                       str(script), *args], TIMEOUT_S)


def epochs_printed(stdout: str) -> list[int]:
    return [int(n) for n in re.findall(r"^epoch (\d+): loss", stdout, flags=re.M)]


@pytest.mark.parametrize("name", ["lightning_train.py", "accelerate_train.py", "torchrun_train.py"])
def test_the_page_quotes_each_example_whole(name):
    assert (EXAMPLES / name).read_text().rstrip("\n") in (DOCS / "trainers.md").read_text()


@pytest.mark.full  # make test-full and CI; test_lightning.py runs Lightning's ddp in make test
def test_lightning_example_trains_on_two_ranks_and_resumes_from_its_checkpoint(packed_lmdb, tmp_path):
    if not installed("pytorch_lightning"):  # found, not imported: the example imports it, not this process
        pytest.skip("pytorch_lightning is not installed")
    script = EXAMPLES / "lightning_train.py"
    first = ["--devices", "2", *SMALL, "--out", str(tmp_path)]
    run_to_end([sys.executable, str(script), str(packed_lmdb), "--epochs", "2", *first], TIMEOUT_S)
    (checkpoint,) = (tmp_path / "lightning_logs" / "version_0" / "checkpoints").glob("*.ckpt")
    assert checkpoint.name == "epoch=1-step=8.ckpt"  # 27 records, 2 ranks, batch 4: 4 steps an epoch
    run_to_end([sys.executable, str(script), str(packed_lmdb), "--epochs", "3", *first, "--resume", str(checkpoint)],
               TIMEOUT_S)
    (resumed,) = (tmp_path / "lightning_logs" / "version_1" / "checkpoints").glob("*.ckpt")
    assert resumed.name == "epoch=2-step=12.ckpt"


# both in make test-rest and CI; make test has Accelerate (test_accelerate.py) and torchrun (tests/train/test_train.py)
@pytest.mark.parametrize("name, saved", [pytest.param("accelerate_train.py", "epoch-1", marks=pytest.mark.full),
                                         pytest.param("torchrun_train.py", "last.pt", marks=pytest.mark.full)])
def test_torchrun_launched_example_trains_on_two_ranks_and_resumes(packed_lmdb, tmp_path, name, saved):
    if name.startswith("accelerate") and not installed("accelerate"):  # found, not imported (as above)
        pytest.skip("accelerate is not installed")
    script = EXAMPLES / name
    out = ["--out", str(tmp_path), *SMALL]
    assert epochs_printed(torchrun(script, str(packed_lmdb), "--epochs", "2", *out)) == [0, 1]  # rank 0 alone
    resumed = torchrun(script, str(packed_lmdb), "--epochs", "3", *out, "--resume", str(tmp_path / saved))
    assert epochs_printed(resumed) == [2]
