"""A local dataset's file replaced by a FIFO or a device: named as a bad file, never blocked on or read
(Location.open used os.open: a loader and `datapipe verify` waited on the FIFO for good)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

SERVE = """
import sys, datapipe
from datapipe.backends.bad_samples import TooManyBadSamples
loader = datapipe.make_loader(sys.argv[1], batch_size=4, image_size=16, num_workers=1, backend="threads")
try:
    for batch in loader:
        pass
except TooManyBadSamples as exc:
    print("refused:", exc)
"""


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_shard_that_is_not_a_file_is_a_bad_file_not_a_hang(packed_wds, tmp_path, kind):
    data = tmp_path / "d.wds"
    shutil.copytree(packed_wds, data)
    shard = sorted(data.glob("*.tar"))[0]
    shard.unlink()
    if kind == "fifo":
        os.mkfifo(shard)
    else:
        shard.symlink_to("/dev/zero")
    done = subprocess.run([sys.executable, "-c", SERVE, str(data)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "not a regular file" in done.stdout and shard.name in done.stdout
    done = subprocess.run([sys.executable, "-m", "datapipe", "verify", str(data)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode != 0 and "not a regular file" in done.stdout + done.stderr
