"""datapipe.Mix and the command line's mixes (`info|preview|train A B --weights --epoch-size`), tried as a
careless user (weights that overflow, underflow or are not numbers; epoch sizes out of range; a weights
function that reads `random`) and a hostile dataset author (class names that differ in case or Unicode
form, or carry terminal escapes; a checkpoint whose loader state's mix block was edited)."""
from __future__ import annotations

import shutil
import subprocess
import sys
import unicodedata
from pathlib import Path

from tools.adversarial.harness import FIXTURES, Case, linking

BIG = 16384  # MB of address space: torch maps far more than it touches
SMALL = ["--batch-size", "4", "--image-size", "32", "--workers", "0", "--backend", "threads"]
TRAIN = ["--model", "resnet18", "--epochs", "1", "--max-steps", "1", *SMALL]
packed = linking("a.lmdb", "b.wds")  # the fixture folder packed once as a.lmdb and b.wds


def folders(**classes: list[str]):
    """setup: an image folder per name, train/CLASS/ holding one fixture image each."""
    image = next(p for p in sorted((FIXTURES / "imagefolder").rglob("*.jpg")))

    def make(tmp: Path) -> None:
        for name, names in classes.items():
            for cls in names:
                (tmp / name / "train" / cls).mkdir(parents=True)
                shutil.copy(image, tmp / name / "train" / cls / "x.jpg")
    return make


def info(name: str, *argv: str, expect: str = "refused", setup=packed) -> Case:
    return Case(name, argv=["datapipe", "info", "a.lmdb", "b.wds", *argv], setup=setup, expect=expect, timeout_s=90,
                mem_mb=BIG)


def edited_checkpoint(edit: str):
    """setup: a one-step train run over the mix, its last.pt's loader state edited by `edit` (Python on `mix`,
    the state's mix block, and `state`, the loader state) and sealed again as the trainer seals it."""
    def make(tmp: Path) -> None:
        packed(tmp)
        subprocess.run([sys.executable, "-m", "datapipe", "train", "a.lmdb", "b.wds", "--weights", "1,1",
                        "--epoch-size", "40", *TRAIN, "--out", str(tmp / "run")], check=True, capture_output=True,
                       timeout=300, cwd=tmp)
        script = ("import sys; from pathlib import Path; from datapipe.train import checkpoint\n"
                  "p = Path(sys.argv[1]); ck = checkpoint.load(p); state = ck['loader']; mix = state['mix']\n"
                  f"{edit}\ncheckpoint.save(p, ck)\n")
        subprocess.run([sys.executable, "-c", script, str(tmp / "run" / "last.pt")], check=True, timeout=120)
    return make


def resume(name: str, edit: str) -> Case:
    return Case(name, argv=["datapipe", "train", "a.lmdb", "b.wds", "--weights", "1,1", "--epoch-size", "40", *TRAIN,
                            "--max-steps", "3", "--out", "run", "--resume", "run/last.pt"],
                setup=edited_checkpoint(edit), timeout_s=400, mem_mb=BIG)


RANDOM_WEIGHTS = """
import collections, random, sys
import datapipe
mix = datapipe.Mix({"a": "a.lmdb", "b": "b.wds"}, weights=lambda e: {"a": random.random(), "b": random.random()},
                   epoch_size=40)
for backend, workers in (("threads", 2), ("dataloader", 0)):
    loader = datapipe.make_loader(mix, backend=backend, num_workers=workers, batch_size=4, image_size=16,
                                  fields=("image", "source"))
    for epoch in range(3):
        loader.set_epoch(epoch)
        got = collections.Counter(int(s) for b in loader for s in b.sources)
        if [got[0], got[1]] != list(mix.counts(epoch)):
            sys.exit(f"epoch {epoch}: served {dict(got)}, counts {mix.counts(epoch)}")
print("each epoch served its counts once")
"""
MALFORMED_STATE = """
import sys
import datapipe
mix = datapipe.Mix({"a": "a.lmdb", "b": "b.wds"}, weights={"a": 1, "b": 1}, epoch_size=40)
loader = datapipe.make_loader(mix, backend="threads", batch_size=4, image_size=16)
next(iter(loader))
state = loader.state_dict()
state["mix"]["draws_before"] = {"a": -1, "b": 10**400}
try:
    datapipe.make_loader(mix, backend="threads", batch_size=4, image_size=16).load_state_dict(state)
except ValueError as exc:
    sys.exit(str(exc))
"""
NFD, ESC = unicodedata.normalize("NFD", "café"), "dog\x1b[2J\x1b]0;pwned\x07"

CASES = [
    info("weights whose sum overflows a float", "--weights", "1e308,1e308", expect="ok"),
    info("a weight past the largest float", "--weights", "1e309,1"),
    info("a weight below the smallest float", "--weights", "1e-400,1"),
    info("a weight in Arabic-Indic digits below the smallest float", "--weights", "\u0661e-400,1"),
    info("a weight that is nan", "--weights", "nan,1"),
    info("a trailing comma", "--weights", "0.7,0.3,"),
    info("100,000 commas", "--weights", "," * 100_000),
    info("a 5,000-digit weight", "--weights", "9" * 5000 + ",1"),
    info("a negative epoch size", "--epoch-size", "-1"),
    info("an epoch size of 10^18 (keys within 64 bits)", "--epoch-size", str(10**18), expect="ok"),
    info("an epoch size of 10^19 (keys past 64 bits)", "--epoch-size", str(10**19)),
    info("decimal weights as written", "--weights", "0.7,0.3", "--epoch-size", "35", expect="ok"),
    Case("the same path twice", argv=["datapipe", "info", "a.lmdb", "a.lmdb"], setup=packed, expect="ok", mem_mb=BIG),
    Case("a source name with terminal escapes", argv=["datapipe", "info", "x\x1b[2J=a.lmdb", "b.wds"], setup=packed,
         mem_mb=BIG),
    Case("class names that differ only in case", argv=["datapipe", "info", "one", "two"],
         setup=folders(one=["Dog", "cat"], two=["dog"]), mem_mb=BIG),
    Case("class names with terminal escapes differing in case", argv=["datapipe", "info", "one", "two"],
         setup=folders(one=[ESC], two=[ESC.upper()]), mem_mb=BIG),
    Case("class names equal once NFC-normalised", argv=["datapipe", "info", "one", "two"],
         setup=folders(one=["café"], two=[NFD]), mem_mb=BIG, expect="ok"),
    Case("2,000 class names equal once NFC-normalised (one warning line)", argv=["datapipe", "info", "one", "two"],
         setup=folders(one=[f"café{i}" for i in range(2000)], two=[f"{NFD}{i}" for i in range(2000)]), mem_mb=BIG,
         expect="ok", timeout_s=120),
    Case("a weights function that reads random", code=RANDOM_WEIGHTS, setup=packed, expect="ok", timeout_s=180,
         mem_mb=BIG),
    Case("a loader state with draws of -1 and 10^400", code=MALFORMED_STATE, setup=packed, timeout_s=120, mem_mb=BIG),
    Case("train over a mix with the deit recipe (aug_repeats 3)",
         argv=["datapipe", "train", "a.lmdb", "b.wds", "--weights", "0.7,0.3", "--epoch-size", "24", "--recipe", "deit",
               *TRAIN, "--out", "run"], setup=packed, expect="ok", timeout_s=400, mem_mb=BIG),
    resume("a checkpoint whose mix block is a list", "state['mix'] = list(mix)"),
    resume("a checkpoint whose mix draws are 10^30", "mix['draws_before']['a.lmdb'] = 10**30"),
    resume("a checkpoint whose mix counts were deleted", "mix.pop('counts', None); state['samples_done'] = 8"),
    resume("a checkpoint at epoch -5", "state['epoch'] = -5"),
]
