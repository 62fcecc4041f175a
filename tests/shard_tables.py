"""Editing a `.wds` dataset's shards as a test needs (a crafted or damaged entry): the split's shard
table written again from its entries, and its manifest entry with it (datapipe.formats.shard_table)."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from datapipe.formats import open_dataset
from datapipe.formats.shard_table import table_file


def shard_entries(folder: Path, split: str = "train") -> list[dict[str, Any]]:
    """Each shard's entry (name, samples, bytes, sha256) of a local dataset's split, as plain dicts."""
    return [dict(entry) for entry in open_dataset(folder, split).shard_entries()]


def edit_shards(folder: Path, body: dict[str, Any], edit: Callable[[list[dict[str, Any]]], None],
                split: str = "train") -> None:
    """`edit` changes the split's shard entries; its table in `folder` and its entry in the manifest
    `body` (a dict the caller writes back) are made from them."""
    entries = shard_entries(folder, split)
    edit(entries)
    name, blob, body["splits"][split]["table"] = table_file(split, entries)
    (Path(folder) / name).write_bytes(blob)


def list_shards(folder: Path, body: dict[str, Any]) -> None:
    """A `.wds` dataset as the datapipe before the shard table wrote it: manifest version 2, each split's
    shards listed in it (the manifest `body`, a dict the caller writes back), no table files. The
    shards, their `.idx` files and the offsets files were the same then."""
    for split, info in body["splits"].items():
        table = info.pop("table", None)
        if table:
            info["shards"] = shard_entries(folder, split)
            (Path(folder) / table["name"]).unlink()
    body["version"] = 2
