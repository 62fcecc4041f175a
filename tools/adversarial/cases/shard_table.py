"""A `.wds` split's shard table (`{split}.shards.bin`), `datapipe verify`'s shard check and an image
folder's fingerprint on resume, tried as a hostile dataset author (crafted shard counts up to 10^11, a
52 GB sparse table behind HTTP, a table that is a FIFO or /dev/zero, shards that are FIFOs, devices,
missing, cut or another sha256) and a careless user (a folder renamed in under a checkpoint)."""
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
_shared: dict[str, Path] = {}


def _packed() -> Path:
    """The fixture folder packed once as d.wds (several shards) for all cases."""
    if not _shared:
        root = Path(tempfile.mkdtemp(prefix="adv-table-"))
        atexit.register(shutil.rmtree, root, True)
        subprocess.run([sys.executable, "-m", "datapipe", "convert", str(FIXTURES / "imagefolder"), str(root / "d.wds"),
                        "--shard-size", "65536"], check=True, capture_output=True, timeout=180)
        _shared["root"] = root
    return _shared["root"]


def wds(edit=None):
    """setup: a copy of d.wds in the case's folder; `edit(folder, body)` changes it (body: the manifest)."""
    def make(tmp: Path) -> None:
        folder = Path(shutil.copytree(_packed() / "d.wds", tmp / "d.wds"))
        if edit is not None:
            body = json.loads((folder / "manifest.json").read_text())
            edit(folder, body)
            (folder / "manifest.json").write_text(json.dumps(body))
    return make


def table(**changes):
    """edit: the train table's manifest entry; `shards` given alone brings `bytes` along (the size it implies)."""
    def edit(folder: Path, body: dict) -> None:
        from datapipe.formats.shard_table import Layout

        entry = body["splits"]["train"]["table"]
        entry.update(changes)
        if "shards" in changes and "bytes" not in changes and isinstance(changes["shards"], int):
            entry["bytes"] = Layout(changes["shards"]).size
    return edit


def replaced(name: str, how: str):
    """edit: the dataset's file `name` made a FIFO, a link to /dev/zero, missing, cut, or given another shard
    sha256 in the table (re-sealed, so only the shard check can tell)."""
    def edit(folder: Path, body: dict) -> None:
        path = folder / name
        if how == "wrong sha256":
            from datapipe.formats import open_dataset
            from datapipe.formats.shard_table import table_file

            entries = [dict(e) for e in open_dataset(folder).shard_entries()]
            entries[0]["sha256"] = "0f" * 32
            table_name, blob, body["splits"]["train"]["table"] = table_file("train", entries)
            (folder / table_name).write_bytes(blob)
            return
        path.unlink()
        if how == "fifo":
            os.mkfifo(path)
        elif how == "zero":
            path.symlink_to("/dev/zero")
        elif how == "cut":
            path.write_bytes(b"\0" * 512)
    return edit


def sparse_table(count: int):
    """edit: the train table a sparse file of the size `count` shards imply (zeros: 52 GB at 10^9)."""
    def edit(folder: Path, body: dict) -> None:
        from datapipe.formats.shard_table import Layout

        table(shards=count)(folder, body)
        with open(folder / "train.shards.bin", "r+b") as fh:
            fh.truncate(Layout(count).size)
    return edit


def listed(edit):
    """edit: the dataset as the datapipe before the shard table wrote it (manifest version 2), then `edit`."""
    def both(folder: Path, body: dict) -> None:
        from tests.shard_tables import list_shards

        list_shards(folder, body)
        edit(folder, body)
    return both


def wrong_listed_sha256(folder: Path, body: dict) -> None:
    body["splits"]["train"]["shards"][0]["sha256"] = "0f" * 32


def verify(name: str, setup, expect: str = "refused") -> Case:
    return Case(name, argv=["datapipe", "verify", "d.wds"], setup=setup, expect=expect, timeout_s=60, mem_mb=BIG)


OPEN = """
import sys
from datapipe.formats import open_dataset
try:
    ds = open_dataset(sys.argv[1] if len(sys.argv) > 1 else "d.wds")
    print(len(ds), ds.shard_sizes().sum(), ds.record(len(ds) - 1).key)
except ValueError as exc:
    sys.exit(str(exc))
"""

# A store on loopback in the case's own process: moto's S3 (or a Range HTTP server over the case's folder),
# the dataset uploaded, then `datapipe verify` on its URL. The fake AWS secret must never be printed.
REMOTE = """
import logging, os, sys
from pathlib import Path
logging.getLogger("werkzeug").setLevel(logging.ERROR)
from tests.storage.conftest import S3Server, upload_folder
s3 = S3Server()
os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_DEFAULT_REGION="us-east-1", AWS_ENDPOINT_URL=s3.endpoint)
url = s3.bucket("data") + "/d.wds"
upload_folder(Path("d.wds"), url)
from datapipe import cli
rc = cli.main(["%s", url])
s3.stop()
sys.exit(rc)
"""
HTTP = """
import http.server, sys
from tests.storage.conftest import RangeHandler, serve, stop_serving
server = serve(http.server.ThreadingHTTPServer(("127.0.0.1", 0), lambda *a, **k: RangeHandler(*a, directory=".", **k)))
from datapipe import cli
rc = cli.main(["verify", f"http://127.0.0.1:{server.server_address[1]}/d.wds"])
stop_serving(server)
sys.exit(rc)
"""

# A mix holding an image folder, saved mid-epoch, a file of the folder renamed before the resume.
MIX_RENAMED = """
import sys
from pathlib import Path
import datapipe
def loader():
    mix = datapipe.Mix({"fo": "images", "wd": "d.wds"}, epoch_size=24, cache_dir="cache")
    return datapipe.make_loader(mix, backend="threads", batch_size=4, image_size=16)
first = loader()
next(iter(first))
state = first.state_dict()
Path("images/train/cat/cat_000.jpg").rename("images/train/cat/zz\\nnew\\x1b[31m.jpg")
try:
    loader().load_state_dict(state)
except ValueError as exc:
    sys.exit(str(exc))
"""


def images_and_wds(tmp: Path) -> None:
    wds()(tmp)
    shutil.copytree(FIXTURES / "imagefolder", tmp / "images")


# A checkpoint's loader state over an image folder, a file renamed before the resume (train's own path).
TRAIN = ["--model", "resnet18", "--epochs", "1", "--batch-size", "4", "--image-size", "32", "--workers", "0",
         "--backend", "threads"]


def trained_then(change: str):
    def make(tmp: Path) -> None:
        shutil.copytree(FIXTURES / "imagefolder", tmp / "images")
        for bad in ("train/cat/truncated.jpg", "train/dog/empty.jpg", "train/dog/text.jpg", "train/fish/bomb.png"):
            (tmp / "images" / bad).unlink()
        subprocess.run([sys.executable, "-m", "datapipe", "train", "images", *TRAIN, "--max-steps", "1", "--out", "run"],
                       check=True, capture_output=True, timeout=300, cwd=tmp)
        if change == "renamed":
            (tmp / "images/train/cat/cat_000.jpg").rename(tmp / "images/train/cat/zz\x1b[2J.jpg")
    return make


def resume(name: str, change: str, expect: str) -> Case:
    return Case(name, argv=["datapipe", "train", "images", *TRAIN, "--max-steps", "2", "--out", "run", "--resume",
                            "run/last.pt"], setup=trained_then(change), expect=expect, timeout_s=400, mem_mb=BIG)


CASES = [
    Case("a count of 10^11 shards (a 7 GB head) opened", code=OPEN, setup=wds(table(shards=10 ** 11)), mem_mb=2048),
    Case("a count of 10^10 shards, bytes as given", code=OPEN, setup=wds(table(shards=10 ** 10)), mem_mb=2048),
    Case("a count of 10^9 shards over a short table", code=OPEN, setup=wds(table(shards=10 ** 9)), mem_mb=2048),
    Case("a count of 10^9 over a 52 GB sparse table (67 MB head of zeros)", code=OPEN, setup=wds(sparse_table(10 ** 9)),
         mem_mb=2048),
    Case("a count of 0 shards for the split's records", code=OPEN, setup=wds(table(shards=0)), mem_mb=2048),
    Case("a count of 2**53 - 1", code=OPEN, setup=wds(table(shards=2 ** 53 - 1)), mem_mb=2048),
    Case("a count that is a string", code=OPEN, setup=wds(table(shards="1e11")), mem_mb=2048),
    Case("table bytes that disagree with the count", code=OPEN, setup=wds(table(bytes=1 << 40)), mem_mb=2048),
    Case("a head_sha256 that is not the head's", code=OPEN, setup=wds(table(head_sha256="ab" * 32)), mem_mb=2048),
    Case("the table is a FIFO", code=OPEN, setup=wds(replaced("train.shards.bin", "fifo")), mem_mb=2048),
    Case("the table is a link to /dev/zero", code=OPEN, setup=wds(replaced("train.shards.bin", "zero")), mem_mb=2048),
    # These two hold once datapipe/formats/inspect.py calls ShardList.verify_files (/tmp/notes/shard-table-verify.patch)
    verify("verify: a shard's sha256 in the table is wrong (records intact)", wds(replaced("", "wrong sha256"))),
    verify("verify: a shard is missing", wds(replaced("train-000001.tar", "missing"))),
    verify("verify: a shard cut to 512 bytes", wds(replaced("train-000001.tar", "cut"))),
    verify("verify: a shard is a link to /dev/zero", wds(replaced("train-000001.tar", "zero"))),
    verify("verify: a shard is a FIFO", wds(replaced("train-000001.tar", "fifo"))),  # hung before d7d3e28
    verify("verify: the table claims 10^11 shards", wds(table(shards=10 ** 11))),
    verify("verify: an intact dataset", wds(), expect="ok"),
    verify("verify: a listed (version 2) manifest with a wrong shard sha256", wds(listed(wrong_listed_sha256))),
    verify("verify: a listed (version 2) manifest, intact", wds(listed(lambda folder, body: None)), expect="ok"),
    Case("S3 (moto): verify with a count of 10^11 shards", code=REMOTE % "verify", setup=wds(table(shards=10 ** 11)),
         timeout_s=180, mem_mb=BIG),
    Case("S3 (moto): info with a count of 10^10 shards", code=REMOTE % "info", setup=wds(table(shards=10 ** 10)),
         expect="either", timeout_s=180, mem_mb=BIG),
    Case("S3 (moto): verify with a count of 10^8 over a short table", code=REMOTE % "verify",
         setup=wds(table(shards=10 ** 8)), timeout_s=180, mem_mb=BIG),
    Case("S3 (moto): verify an intact dataset", code=REMOTE % "verify", setup=wds(), expect="ok", timeout_s=180,
         mem_mb=BIG),
    Case("HTTP: verify a 52 GB sparse table claiming 10^9 shards", code=HTTP, setup=wds(sparse_table(10 ** 9)),
         timeout_s=180, mem_mb=BIG),
    Case("a mix's folder with a file renamed (newline, escape) mid-epoch", code=MIX_RENAMED, setup=images_and_wds,
         timeout_s=180, mem_mb=BIG),
    resume("train --resume over a folder with a file renamed (a terminal escape in its name)", "renamed", "refused"),
    resume("train --resume over an unchanged folder", "none", "ok"),
]
