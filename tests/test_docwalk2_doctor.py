"""`datapipe doctor` without a GPU names it in words: the line read `info  gpu  None` (a Python None
printed), beside `cuda  none (CPU build)` and `dali  not installed`."""
import json

import torch

from datapipe.cli import main



def test_no_gpu_is_said_in_words(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # what a machine without a GPU sees, on any machine
    assert main(["doctor"]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.split()[1:2] == ["gpu"])
    assert line.split(None, 2)[2] == "none visible" and "None" not in line
    assert main(["doctor", "--json"]) == 0
    checks = {c["name"]: c for c in json.loads(capsys.readouterr().out)["checks"]}
    assert checks["gpu"]["value"] == "none visible" and checks["gpu"]["status"] == "info"
