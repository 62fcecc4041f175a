"""`datapipe train`'s surfaces of #47 rows 7-8 and #48 rows 6, 12, tried as a hostile dataset author
(data without labels, or with some records unlabelled; a group-writable --out whose train.lock holds
terminal escapes, 60 KB fields, deep nesting, or is a FIFO or a link) and a careless user (model
names that are not models, ViT sizes that are not whole patches, a timm/ model without timm, short
runs that must still say what they trained)."""
from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tools.adversarial.harness import FIXTURES, Case

BIG = 16384  # MB of address space: torch maps far more than it touches
SMALL = ["--batch-size", "4", "--image-size", "32", "--workers", "0", "--backend", "dataloader", "--tensorboard", "off"]
TRAIN = ["--model", "resnet18", "--epochs", "1", "--max-steps", "1", *SMALL]
ESC = "\x1b]0;pwned\x07\x1b[2J\x1b[H\u202e"
_shared: dict[str, Path] = {}


def _made() -> Path:
    """Once for all cases: the fixture folder packed as a.lmdb; img2dataset-like shards without .cls
    (captions/); webdataset shards where every third sample has no .cls (some/part.tar)."""
    if not _shared:
        root = Path(tempfile.mkdtemp(prefix="adv-train-"))
        atexit.register(shutil.rmtree, root, True)
        subprocess.run([sys.executable, "-m", "datapipe", "convert", str(FIXTURES / "imagefolder"), str(root / "a.lmdb")],
                       check=True, capture_output=True, timeout=180)
        script = (
            "import sys, webdataset as wds\nfrom pathlib import Path\n"
            "from tools.make_img2dataset_sample import make\nfrom datapipe.formats.scan import scan_folder\n"
            "root = Path(sys.argv[1]); make(root / 'captions', shards=2, per_shard=6, failed=0, seed=1)\n"
            "(root / 'some').mkdir()\n"
            "files = [f for f in scan_folder(Path(sys.argv[2])).splits['train'] if f.path.read_bytes()[:3] == b'\\xff\\xd8\\xff']\n"
            "with wds.TarWriter(str(root / 'some' / 'part.tar')) as sink:\n"
            "    for i, f in enumerate(files):\n"
            "        sink.write({'__key__': f.key, 'jpg': f.path.read_bytes(), **({'cls': str(f.label)} if i % 3 else {})})\n")
        subprocess.run([sys.executable, "-c", script, str(root), str(FIXTURES / "imagefolder")], check=True,
                       capture_output=True, timeout=180, env={**os.environ, "PYTHONPATH": str(FIXTURES.parent)})
        _shared["root"] = root
    return _shared["root"]


def data(tmp: Path) -> None:
    for name in ("a.lmdb", "captions", "some"):
        (tmp / name).symlink_to(_made() / name)


def locked(body: "bytes | None" = None, *, link: str | None = None, fifo: bool = False):
    """setup: the data, and run/train.lock holding `body` (fresh: another host's live run), a link, or a FIFO."""
    def make(tmp: Path) -> None:
        data(tmp)
        (tmp / "run").mkdir()
        lock = tmp / "run" / "train.lock"
        if link is not None:
            lock.symlink_to(link)
        elif fifo:
            os.mkfifo(lock)
        else:
            lock.write_bytes(body)
    return make


def lock_json(**fields) -> bytes:
    return json.dumps({"host": "node-b", "pid": 4242, "since": "2026-11-25T10:00:00+00:00", **fields}).encode()


def train(name: str, *argv: str, expect: str = "refused", setup=data, timeout_s: float = 300) -> Case:
    return Case(name, argv=["datapipe", "train", *argv], setup=setup, expect=expect, timeout_s=timeout_s, mem_mb=BIG)


CASES = [
    # data without labels (#47 row 7)
    train("a dataset without labels (img2dataset shards)", "captions", *TRAIN, "--out", "run"),
    train("a mix with a source without labels", "a.lmdb", "web=captions", "--weights", "0.7,0.3", *TRAIN, "--out", "run"),
    train("a mix with a source without labels at weight 0", "a.lmdb", "web=captions", "--weights", "1,0", *TRAIN,
          "--out", "run", expect="ok"),
    train("a dataset where every third record has no label", "some/part.tar", *TRAIN, "--log-every", "1", "--out", "run"),
    train("some records without a label under the deit recipe (soft targets)", "some/part.tar", *TRAIN, "--recipe",
          "deit", "--log-every", "1", "--out", "run"),
    # a hostile train.lock in a group-writable --out (#47 row 8)
    train("a lock whose fields are terminal escapes", "a.lmdb", *TRAIN, "--out", "run",
          setup=locked(lock_json(host=ESC * 40, pid=ESC * 10, since={"x": [ESC] * 10}))),  # under 4 KiB: read
    train("a lock whose host field is 60 KB of escapes", "a.lmdb", *TRAIN, "--out", "run", expect="ok",
          setup=locked(lock_json(host=ESC * 1390))),
    train("a lock of 4,000 nested lists", "a.lmdb", *TRAIN, "--out", "run", expect="ok",
          setup=locked(b"[" * 4000)),
    train("a lock whose pid has 4,000 digits", "a.lmdb", *TRAIN, "--out", "run",
          setup=locked(b'{"host": "node-b", "pid": ' + b"9" * 4000 + b"}")),
    train("a lock that is not UTF-8", "a.lmdb", *TRAIN, "--out", "run", expect="ok", setup=locked(b"\xff\xfe" * 100)),
    train("a lock that is a link to /dev/zero", "a.lmdb", *TRAIN, "--out", "run", setup=locked(link="/dev/zero")),
    train("a lock that is a FIFO", "a.lmdb", *TRAIN, "--out", "run", setup=locked(fifo=True), timeout_s=120),
    # models (#48 row 12)
    train("--model timm/NAME without timm", "a.lmdb", *TRAIN, "--model", "timm/vit_small_patch16_224", "--out", "run"),
    train("--model torchvision/NAME without torchvision", "a.lmdb", *TRAIN, "--model", "torchvision/../../x",
          "--out", "run"),
    train("--model with terminal escapes", "a.lmdb", *TRAIN, "--model", ESC + "resnet50", "--out", "run"),
    train("--model of 100,000 characters", "a.lmdb", *TRAIN, "--model", "x" * 100_000, "--out", "run"),
    train("--model deit_tiny at 40 px (not whole patches)", "a.lmdb", *TRAIN, "--model", "deit_tiny", "--image-size",
          "40", "--out", "run"),
    train("--model deit_tiny at 8 px (less than a patch)", "a.lmdb", *TRAIN, "--model", "deit_tiny", "--image-size",
          "8", "--out", "run"),
    train("--model deit_tiny --recipe deit, 2 steps at 32 px", "a.lmdb", *TRAIN, "--model", "deit_tiny", "--recipe",
          "deit", "--max-steps", "2", "--out", "run", expect="ok"),
    train("--model vit_base_patch16_224 (an alias), 1 step at 16 px", "a.lmdb", *TRAIN, "--model",
          "vit_base_patch16_224", "--image-size", "16", "--out", "run", expect="ok", timeout_s=400),
    # short runs say what they trained (#48 row 6)
    train("docs/mixing.md's command, --max-steps 2", "a.lmdb", "a2=a.lmdb", "--weights", "0.7,0.3", "--epoch-size",
          "16", *TRAIN, "--max-steps", "2", "--out", "run", expect="ok"),
    train("--max-steps past the run's steps", "a.lmdb", *TRAIN, "--max-steps", str(10**18), "--out", "run",
          expect="ok"),
]
