"""Tiny image folders whose images carry sidecars, a caption `NAME.txt` and metadata `NAME.json` beside
`NAME.jpg` (the fixture folder's own small JPEGs): for the converter's, the formats' and the loader's
tests of records with fields."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from datapipe.records import NO_FIELDS, Fields, canonical_meta
from tests.conftest import IMAGEFOLDER

IMAGES = ["train/cat/cat_000.jpg", "train/cat/cat_001.jpg", "train/cat/cat_002.jpg", "train/cat/cat_003.jpg",
          "train/dog/dog_000.jpg", "train/dog/dog_001.jpg", "train/dog/dog_002.jpg", "train/dog/dog_003.jpg",
          "train/fish/fish_000.jpg", "train/fish/fish_001.jpg", "train/fish/fish_002.jpg", "train/fish/fish_003.jpg",
          "val/cat/cat_000.jpg", "val/dog/dog_000.jpg"]  # train: two 64 KiB .wds shards
CAPTIONS = {  # the caption file's text, as written (one trailing newline is not part of the caption)
    "train/cat/cat_000.jpg": "a cat on a mat\n",
    "train/cat/cat_001.jpg": "ünïcødé: 猫 🐱, «ŝ»\n",
    "train/cat/cat_002.jpg": "",
    "train/dog/dog_000.jpg": "two lines\nof caption\r\n",
    "train/dog/dog_003.jpg": "  spaces kept  \n\n",
    "train/fish/fish_002.jpg": "a fish",
    "val/cat/cat_000.jpg": "a val cat",
}
METAS = {  # written with spaces and unsorted keys: stored canonical
    "train/cat/cat_000.jpg": {"width": 32, "source": {"url": "http://x.example/é.jpg", "a": [1, None]}},
    "train/dog/dog_001.jpg": {"similarity": 0.25, "tags": ["dog", "grass"]},
}
BAD = {  # image -> (sidecar name, bytes, what the skip reason says)
    "train/dog/dog_004.jpg": ("dog_004.txt", b"caf\xe9\n", r"caption train/dog/dog_004\.txt is not UTF-8"),
    "train/cat/cat_004.jpg": ("cat_004.json", b"{not json", r"metadata train/cat/cat_004\.json is not valid JSON"),
    "val/dog/dog_001.jpg": ("dog_001.json", b"[1, 2]",
                            r"metadata val/dog/dog_001\.json is not a JSON object \(it holds a JSON array\)"),
}


def expected_fields(relpath: str) -> Fields:
    """What the record of image `relpath` of `write_caption_folder` carries."""
    text = CAPTIONS.get(relpath)
    if text is not None:
        text = text[:-2] if text.endswith("\r\n") else text[:-1] if text.endswith("\n") else text
    meta = METAS.get(relpath)
    fields = Fields(text, None if meta is None else canonical_meta(meta))
    return fields if fields else NO_FIELDS


def write_caption_folder(root: Path) -> Path:
    """root/{train,val}/CLASS/NAME.jpg with NAME.txt / NAME.json beside some of them (and the fixture's
    `notes.txt`, beside no image: not a caption)."""
    for relpath in IMAGES:
        (root / relpath).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(IMAGEFOLDER / "train" / Path(relpath).relative_to(relpath.split("/")[0]), root / relpath)
        stem = (root / relpath).with_suffix("")
        if relpath in CAPTIONS:
            stem.with_suffix(".txt").write_bytes(CAPTIONS[relpath].encode("utf-8"))
        if relpath in METAS:
            stem.with_suffix(".json").write_text(json.dumps(METAS[relpath], indent=2, ensure_ascii=False),
                                                 encoding="utf-8")
    shutil.copy(IMAGEFOLDER / "train/cat/notes.txt", root / "train/cat/notes.txt")
    return root


def write_bad_sidecars(root: Path) -> dict[str, str]:
    """Add the BAD images and sidecars to a caption folder; image -> the skip reason's pattern."""
    for relpath, (name, blob, _) in BAD.items():
        image = root / relpath
        if not image.exists():
            shutil.copy(IMAGEFOLDER / "train" / Path(relpath).relative_to(relpath.split("/")[0]), image)
        (image.parent / name).write_bytes(blob)
    return {relpath: reason for relpath, (_, _, reason) in BAD.items()}
