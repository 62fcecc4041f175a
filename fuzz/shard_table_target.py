"""The `shard_table` fuzz target: a `.wds` split's `{split}.shards.bin` (datapipe/formats/shard_table.py)
under a manifest entry that agrees with it, as a stranger's dataset would give both.
fuzz/targets.py registers it.

An input is one mode byte, then the table's bytes, cut or padded with zeros to the size the shard count
in their head implies. The entry is computed from those bytes: their size, their sha256 and their head's
sha256, so the head check passes and the reader's structural checks are what stands. Mode bit 1 also
re-seals the input first: each block's sha256 in the head is recomputed from the columns as they are, so
mutated record starts, sizes and file numbers reach the checks behind the digests. The oracle:
ShardTableDamaged (a ValueError) or results that agree (the shard holding record i starts at or before
i and ends after it, the sizes sum to the records, a shard's name is `train-NNNNNN.tar` and its size a
tar's); in time and within the memory bound.
"""
from __future__ import annotations

import atexit
import hashlib
import re
import shutil
import tempfile
import time
from pathlib import Path

from fuzz.contract import Finding, Target, timed

MAX_SHARDS = 2048  # two blocks: a padded table stays ~110 KB, inside the memory bound's constant
_DIR: Path | None = None


def _folder() -> Path:
    global _DIR
    if _DIR is None:
        _DIR = Path(tempfile.mkdtemp(prefix="datapipe-fuzz-table-"))
        atexit.register(shutil.rmtree, _DIR, True)
    return _DIR


def _table(shards: int, samples: int = 5) -> bytes:
    from datapipe.formats.shard_table import table_file

    entries = [{"name": f"train-{i * 3:06d}.tar", "samples": samples + i % 4, "bytes": 10240 + 512 * i,
                "sha256": hashlib.sha256(str(i).encode()).hexdigest()} for i in range(shards)]
    return table_file("train", entries)[1]


def shard_table_seeds() -> list[bytes]:
    """Tables of 1, 3, a block's worth and a block and a bit of shards, raw and to be re-sealed."""
    from datapipe.formats.shard_table import BLOCK_ROWS

    tables = [_table(1), _table(3), _table(BLOCK_ROWS), _table(BLOCK_ROWS + 5, samples=0)]
    return [bytes([mode]) + t for t in tables for mode in (0, 1)]


def _resealed(table: bytes, shards: int) -> bytes:
    """`table` with each block's sha256 in its head recomputed from its columns as they are."""
    from datapipe.formats.shard_table import HEAD, Layout

    layout, digests = Layout(shards), []
    for block in range(layout.blocks):
        for column in (0, 1):
            at, length, _, _ = layout.span(column, block)
            digests.append(hashlib.sha256(table[at:at + length]).digest())
    at = HEAD.size + 8 * (layout.blocks + 1)
    return table[:at] + b"".join(digests) + table[at + 64 * layout.blocks:]


def check_shard_table(data: bytes) -> None:
    from datapipe.formats.shard_table import HEAD, Layout, ShardTable, ShardTableDamaged
    from datapipe.formats.tar import END_OF_ARCHIVE
    from datapipe.storage import Location

    start = time.process_time()
    if len(data) < 1 + HEAD.size:
        return
    mode, table = data[0], data[1:]
    _, _, _, shards, records = HEAD.unpack_from(table)
    if shards > MAX_SHARDS:
        return
    layout = Layout(shards)  # the bytes cut or padded to the size the count implies (a size that differs
    table = table[:layout.size].ljust(layout.size, b"\0")  # is refused first: tests/formats/test_shard_table.py)
    if mode & 1:
        table = _resealed(table, shards)
    entry = {"name": "train.shards.bin", "bytes": len(table), "sha256": hashlib.sha256(table).hexdigest(),
             "head_sha256": hashlib.sha256(table[:layout.head]).hexdigest(), "shards": shards,
             "shard_bytes": 0, "largest_shard": 0}
    folder = _folder()
    (folder / "train.shards.bin").write_bytes(table)
    try:
        got = ShardTable(Location.local(folder), "train", entry, records=records)
        sizes = got.sizes()
        if int(sizes.sum()) != records or (len(sizes) and int(sizes.min()) < 0):
            raise Finding(f"shard_table: sizes sum to {int(sizes.sum())} (min {sizes.min()}), records {records}")
        for index in sorted(i for i in {0, records // 2, records - 1} if 0 <= i < records):
            k = got.shard_of(index)
            if not (0 <= k < shards and got.first(k) <= index < got.first(k + 1)):
                raise Finding(f"shard_table: record {index} placed in shard {k}, which does not hold it")
        for k in sorted(i for i in {0, shards // 2, shards - 1} if 0 <= i < shards):
            row = got.entry(k)
            if (not re.fullmatch(r"train-\d{6,}\.tar", row["name"]) or row["samples"] < 0 or len(row["sha256"]) != 64
                    or not END_OF_ARCHIVE <= row["bytes"] < 1 << 53):
                raise Finding(f"shard_table: shard {k} reads as {row}")
    except ShardTableDamaged:
        pass
    timed("shard_table", start)


TARGET = Target("shard_table", check_shard_table, shard_table_seeds,
                ("datapipe.formats.shard_table",), memory=(16, 1 << 20))
