"""last.pt carries the sha256 of its bytes: a damaged checkpoint is one line at resume, never a
traceback or a silent resume; a full disk while saving is one line and keeps the previous last.pt."""
import hashlib
import logging
import re
import struct
import subprocess

import pytest
import torch

from datapipe.train import train
from datapipe.train.checkpoint import load, run_settings, save
from tests.converters.faults import run_datapipe
from tests.train.support import config

RUN_S = 300  # a CLI run of a step or two, on a loaded 2-core machine
FOOTER = struct.Struct("<8s32sQ")  # the format, spelled out: b"DPSHA256", the zip's sha256, the zip's length


@pytest.fixture(scope="module")
def one_step(learnable, tmp_path_factory):
    """A real last.pt: resnet18 after one optimizer step (batch 36: two steps an epoch)."""
    out = tmp_path_factory.mktemp("one-step")
    train(config(learnable, out, epochs=1, batch_size=36, max_steps=1, workers=0, tensorboard="off"))
    return out / "last.pt"


def test_a_checkpoint_ends_with_the_sha256_of_its_zip_and_still_loads_anywhere(tmp_path):
    state = {"model": {"w": torch.arange(1000.0)}, "config": {"lr": 0.5, "batch_size": 7}, "metrics": []}
    save(tmp_path / "last.pt", state)
    data = (tmp_path / "last.pt").read_bytes()
    magic, digest, size = FOOTER.unpack(data[-FOOTER.size:])
    assert (magic, size) == (b"DPSHA256", len(data) - FOOTER.size)
    assert digest == hashlib.sha256(data[:size]).digest()
    assert torch.equal(load(tmp_path / "last.pt")["model"]["w"], state["model"]["w"])
    assert run_settings(tmp_path / "last.pt")["lr"] == 0.5  # the CLI's memory-mapped read
    assert torch.load(tmp_path / "last.pt", weights_only=True)["config"] == state["config"]  # plain torch too
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt"]  # no temp file left


def test_a_checkpoint_from_before_the_digest_still_loads_and_says_so(tmp_path, caplog):
    torch.save({"model": {"w": torch.ones(3)}, "config": {"lr": 0.1}}, tmp_path / "old.pt")
    with caplog.at_level(logging.INFO, logger="datapipe.train"):
        assert run_settings(tmp_path / "old.pt")["lr"] == 0.1
        assert torch.equal(load(tmp_path / "old.pt")["model"]["w"], torch.ones(3))
    assert "has no sha256 footer (written by an older datapipe): loaded without an integrity check" in caplog.text


def _flip_a_byte(data: bytes) -> bytes:
    middle = len(data) // 2  # in the weights: torch alone would load them, changed
    return data[:middle] + bytes([data[middle] ^ 0x10]) + data[middle + 1:]


@pytest.mark.parametrize("damage, why", [
    (lambda data: b"", r"it is empty \(0 bytes\)"),
    (lambda data: data[:len(data) // 3], r"it is truncated or not a checkpoint \([\d,]+ bytes, no end record\)"),
    (_flip_a_byte, r"its content does not match the sha256 it was saved with"),
], ids=["empty", "truncated", "flipped-byte"])
def test_a_damaged_checkpoint_is_one_line_at_resume(learnable, one_step, tmp_path, damage, why):
    damaged = tmp_path / "last.pt"
    damaged.write_bytes(damage(one_step.read_bytes()))
    done = run_datapipe(["train", learnable, "--resume", str(damaged), "--out", str(tmp_path / "run"),
                         "--workers", "0", "--max-steps", "2", "--tensorboard", "off"], timeout=RUN_S)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and errors[0] == done.stderr.strip().splitlines()[-1], done.stderr[-2000:]
    assert errors[0].startswith(f"datapipe train: error: cannot resume from {damaged}: ")
    assert re.search(why, errors[0]), errors[0]
    assert errors[0].endswith("; resume from an earlier copy of the checkpoint, or start again with a new --out")


@pytest.fixture
def small_disk(tmp_path, one_step):
    """A real tmpfs with room for one checkpoint and a half, where mounting is allowed (root)."""
    mount = tmp_path / "small-disk"
    mount.mkdir()
    size_k = one_step.stat().st_size * 3 // 2 // 1024
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_k}k", "tmpfs", str(mount)], capture_output=True)
    if done.returncode:
        pytest.skip(f"cannot mount a small tmpfs here: {done.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_while_saving_is_one_line_and_keeps_the_previous_checkpoint(learnable, small_disk):
    """Step 1's last.pt fits, step 2's does not (both are on the disk until the rename)."""
    done = run_datapipe(["train", learnable, "--model", "resnet18", "--epochs", "1", "--batch-size", "36",
                         "--image-size", "32", "--workers", "0", "--backend", "dataloader", "--save-every", "1",
                         "--max-steps", "2", "--tensorboard", "off", "--out", str(small_disk)], timeout=RUN_S)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    folder = re.escape(str(small_disk))
    assert re.fullmatch(rf"datapipe train: error: disk full: about [\d,]+ bytes needed in {folder} to write last.pt, "
                        rf"[\d,]+ free; the previous checkpoint {folder}/last.pt .*", last), last
    assert last.endswith(f"is intact: free space there (or give --out a larger disk), then resume with --resume "
                         f"{small_disk / 'last.pt'}")
    # the partial last.pt.tmp removed; metrics.jsonl holds what was trained when it fits (a few hundred bytes)
    assert sorted(p.name for p in small_disk.iterdir()) in (["last.pt"], ["last.pt", "metrics.jsonl"])
    assert load(small_disk / "last.pt")["step"] == 1  # whole, and its digest checks
