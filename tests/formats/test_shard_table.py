"""A `.wds` split's shard table (`{split}.shards.bin`, manifest version 3; datapipe.formats.shard_table):
written by both writers, read a block at a time (memory-mapped; by byte range from a store), every
block checked, a small pickle however many shards; datasets whose manifest lists the shards still open."""
from __future__ import annotations

import hashlib
import http.server
import json
import pickle
import re
import shutil
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from converters import ConvertOptions, convert
from datapipe.formats import open_dataset
from datapipe.formats.base import write_dir_manifest
from datapipe.formats import shard_table
from datapipe.formats.shard_table import BLOCK_ROWS, READ_CHUNK, Layout, ShardTableDamaged, table_file
from datapipe.formats.tar import END_OF_ARCHIVE
from datapipe.formats.wds_index import offsets_name, shard_name
from datapipe.formats.inspect import verify
from datapipe.records import TABLE_VERSION, Manifest, SplitInfo
from tests.conftest import IMAGEFOLDER
from tests.formats.test_index_scale import synthetic_wds
from tests.shard_tables import edit_shards, list_shards, shard_entries
from tests.storage.conftest import RangeHandler, isolated_cache, serve, stop_serving, upload_folder
from tests.storage.conftest import s3  # noqa: F401  (a fixture: moto's S3 server on 127.0.0.1)


def records(ds) -> list:
    return [ds.record(i) for i in range(len(ds))]


@pytest.fixture(scope="module")
def many(tmp_path_factory) -> Path:
    """1,500 shards of 2 records (two blocks of the table), written by WdsWriter."""
    return synthetic_wds(tmp_path_factory.mktemp("many") / "many.wds", 3_000, shard_bytes=8 << 10)


def test_the_writers_put_the_shards_in_a_table_not_the_manifest(many, packed_wds):
    for folder in (many, packed_wds):  # WdsWriter; `datapipe convert` (converters.sharded)
        body = json.loads((folder / "manifest.json").read_text())
        assert body["version"] == TABLE_VERSION
        for split, info in body["splits"].items():
            assert "shards" not in info or info["shards"] == []
            table = info["table"]
            assert (folder / table["name"]).stat().st_size == table["bytes"] == Layout(table["shards"]).size
            assert hashlib.sha256((folder / table["name"]).read_bytes()).hexdigest() == table["sha256"]
            names = sorted(p.name for p in folder.glob(f"{split}-*.tar"))
            assert [s["name"] for s in shard_entries(folder, split)] == names
    assert len(open_dataset(many).shard_entries()) == 1_500 > BLOCK_ROWS


def test_every_record_reads_back_byte_exact_through_the_table_as_through_the_listed_shards(many, tmp_path):
    listed = tmp_path / "listed.wds"
    shutil.copytree(many, listed)
    body = json.loads((listed / "manifest.json").read_text())
    list_shards(listed, body)
    (listed / "manifest.json").write_text(json.dumps(body))
    table, before = open_dataset(many), open_dataset(listed)
    assert type(table.shards).__name__ == "ShardTable" and type(before.shards).__name__ == "ListedShards"
    assert records(table) == records(before)
    assert [r.key for r in records(table)] == [f"r{i:08d}" for i in range(3_000)]
    assert list(table.shard_entries()) == list(before.shard_entries())
    assert table.shard_sizes().tolist() == before.shard_sizes().tolist() == [2] * 1_500
    assert [table.index.span(i) for i in range(0, 3_000, 7)] == [before.index.span(i) for i in range(0, 3_000, 7)]


def test_a_table_of_uneven_shards_across_many_blocks_answers_as_the_list(tmp_path):
    rng = np.random.default_rng(0)
    samples = rng.integers(1, 9, 5_000)
    entries = [{"name": shard_name("val", 3 * k), "samples": int(n), "bytes": int(n) * 4096 + END_OF_ARCHIVE,
                "sha256": hashlib.sha256(str(k).encode()).hexdigest()} for k, n in enumerate(samples)]
    name, blob, entry = table_file("val", entries)
    (tmp_path / name).write_bytes(blob)
    from datapipe.formats.shard_table import ShardTable
    from datapipe.storage import Location

    table = ShardTable(Location.local(tmp_path), "val", entry, records=int(samples.sum()))
    first = np.concatenate([[0], np.cumsum(samples)])
    for index in rng.integers(0, first[-1], 2_000).tolist() + [0, int(first[-1]) - 1, *first[1:-1:997].tolist()]:
        assert table.shard_of(index) == int(np.searchsorted(first, index, side="right")) - 1
    assert [table.entry(k) for k in (0, 1023, 1024, 4_999)] == [entries[k] for k in (0, 1023, 1024, 4_999)]
    assert table.sizes().tolist() == samples.tolist() and table.shard_of(int(first[2_500])) == 2_500
    assert (table.total_bytes, table.largest) == (sum(e["bytes"] for e in entries), max(e["bytes"] for e in entries))
    with pytest.raises(ValueError, match=r"^shard 'train-000000.tar' of split 'val': a shard table holds shards "
                                         r"named val-NNNNNN.tar with a sha256; write it with datapipe's writers$"):
        table_file("val", [{**entries[0], "name": "train-000000.tar"}])


def test_a_dataset_whose_manifest_lists_its_shards_opens_as_before_with_the_same_fingerprint(packed_wds, tmp_path):
    """A `.wds` written before the table (manifest version 2): read from its list, its manifest and
    content fingerprints those the code before computed (the same JSON, the same resume positions)."""
    listed = tmp_path / "listed.wds"
    shutil.copytree(packed_wds, listed)
    body = json.loads((listed / "manifest.json").read_text())
    list_shards(listed, body)
    text = json.dumps(body, indent=1, sort_keys=True)  # what Manifest.to_json wrote then
    (listed / "manifest.json").write_text(text)
    manifest = Manifest.from_json(text)
    assert manifest.to_json() == text and not list(listed.glob("*.shards.bin"))
    for split in ("train", "val"):
        ds, now = open_dataset(listed, split), open_dataset(packed_wds, split)
        assert records(ds) == records(now)
        info = body["splits"][split]
        before = [split, info["digest"], info["samples"], [s["samples"] for s in info["shards"]], body["classes"]]
        assert ds.fingerprint == hashlib.sha256(json.dumps(before).encode()).hexdigest() != now.fingerprint


def tampered(packed_wds, tmp_path, at: int | None = None, cut: bool = False) -> Path:
    folder = tmp_path / "tampered.wds"
    shutil.copytree(packed_wds, folder)
    path = folder / "train.shards.bin"
    blob = bytearray(path.read_bytes())
    if at is not None:
        blob[at] ^= 0x01
    path.write_bytes(bytes(blob[:-1] if cut else blob))
    return folder


ONE_LINE = r"; the shard table is damaged or the dataset was replaced since its manifest was read: re-convert it, or reopen it$"


def test_a_tampered_table_is_refused_in_one_line(packed_wds, tmp_path):
    layout = Layout(open_dataset(packed_wds).shard_entries().count)
    where = re.escape(str(tmp_path / "tampered.wds" / "train.shards.bin"))
    for at, cut, message in [(20, False, "its head differs from the manifest's head_sha256"),
                             (None, True, rf"it is {layout.size - 1:,} bytes, the manifest says {layout.size:,}")]:
        shutil.rmtree(tmp_path / "tampered.wds", ignore_errors=True)
        with pytest.raises(ShardTableDamaged, match=f"^{where}: {message}{ONE_LINE}"):
            open_dataset(tampered(packed_wds, tmp_path, at, cut))
    shutil.rmtree(tmp_path / "tampered.wds")
    folder = tampered(packed_wds, tmp_path, at=layout.rows_at + 44 + 20)  # shard 1's sha256, in the rows' block
    ds = open_dataset(folder)  # the head is sound: blocks are checked when read
    with pytest.raises(ShardTableDamaged, match=f"^{where}: the sizes and digests of shards 0-{layout.shards - 1} "
                                                f"differ from the sha256 its head gives{ONE_LINE}") as caught:
        ds.record(0)
    assert "\n" not in str(caught.value) and isinstance(caught.value, ValueError)
    report = verify(folder, progress=False)
    assert any("its sha256 differs from the manifest's" in p for p in report.problems)


def test_a_crafted_table_whose_digests_match_is_still_refused(packed_wds, tmp_path):
    folder = tmp_path / "crafted.wds"
    shutil.copytree(packed_wds, folder)
    body = json.loads((folder / "manifest.json").read_text())
    edit_shards(folder, body, lambda shards: shards[1].update(bytes=100))  # shorter than a tar's end
    (folder / "manifest.json").write_text(json.dumps(body))
    with pytest.raises(ShardTableDamaged, match=r"a size of shards 0-\d+ is not a tar's"):
        open_dataset(folder).record(0)


class LoggedRanges(RangeHandler):
    """The Range server, noting (path, Range header) of every GET of a shard table."""

    seen: list[tuple[str, str]] = []

    def send_head(self):
        if self.path.endswith(".shards.bin"):
            self.seen.append((self.path, self.headers.get("Range", "")))
        return super().send_head()


@pytest.fixture
def logged_http(tmp_path, monkeypatch):
    root = tmp_path / "www"
    root.mkdir()
    LoggedRanges.seen = []
    server = serve(http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), lambda *a, **k: LoggedRanges(*a, directory=str(root), **k)))
    isolated_cache(monkeypatch, tmp_path)
    yield root, f"http://127.0.0.1:{server.server_address[1]}"
    stop_serving(server)


def test_a_remote_table_is_read_by_range_only_the_blocks_needed_once(logged_http, many, tmp_path):
    root, base = logged_http
    shutil.copytree(many, root / "many.wds")
    layout = Layout(1_500)
    ds = open_dataset(f"{base}/many.wds", cache_dir=tmp_path / "cache")
    assert LoggedRanges.seen == [("/many.wds/train.shards.bin", f"bytes=0-{layout.head - 1}")]  # the head only
    sent = len(pickle.dumps(ds))
    last = len(ds) - 1  # in shard 1,499, the table's second block
    assert ds.record(last).key == f"r{last:08d}" and ds.record(last - 1).key == f"r{last - 1:08d}"

    def block(column: int, b: int) -> str:
        at, length, _, _ = layout.span(column, b)
        return f"bytes={at}-{at + length - 1}"
    assert sorted(r for _, r in LoggedRanges.seen[1:]) == sorted([block(0, 1), block(1, 1)])  # its starts, its row
    assert len(pickle.dumps(ds)) == sent, "a worker is sent the blocks read so far"
    assert ds.shard_sizes().tolist() == [2] * 1_500
    assert LoggedRanges.seen[-1][1] == f"bytes={layout.first_at}-{layout.rows_at - 1}"  # the first column, whole
    assert len(LoggedRanges.seen) == 4
    copy = pickle.loads(pickle.dumps(ds))  # a worker: its own head, then its blocks
    assert copy.record(0).key == "r00000000" and len(LoggedRanges.seen) == 7


def test_a_table_tampered_in_the_store_is_refused_in_one_line(logged_http, many, tmp_path):
    root, base = logged_http
    shutil.copytree(many, root / "many.wds")
    path = root / "many.wds" / "train.shards.bin"
    blob = bytearray(path.read_bytes())
    blob[Layout(1_500).first_at + 8 * BLOCK_ROWS + 3] ^= 0x40  # a record start in the second block
    path.write_bytes(bytes(blob))
    ds = open_dataset(f"{base}/many.wds", cache_dir=tmp_path / "cache")
    assert ds.record(0).key == "r00000000"  # the first block is sound
    with pytest.raises(ShardTableDamaged, match=rf"^{base}/many.wds/train.shards.bin: the record starts of shards "
                                                rf"1,024-1,499 differ from the sha256 its head gives{ONE_LINE}"):
        ds.record(2_999)


def sparse_table_dataset(folder: Path, shards: int) -> Path:
    """A .wds of `shards` one-record shards whose files do not exist: a manifest, a table, an offsets file."""
    folder.mkdir()
    entries = [{"name": shard_name("train", k), "samples": 1, "bytes": 2 * END_OF_ARCHIVE, "sha256": "ab" * 32}
               for k in range(shards)]
    name, blob, table = table_file("train", entries)
    (folder / name).write_bytes(blob)
    offsets = np.lib.format.open_memmap(folder / offsets_name("train"), mode="w+", dtype="<i8", shape=(shards,))
    del offsets
    index = {"name": offsets_name("train"), "bytes": (folder / offsets_name("train")).stat().st_size}
    info = SplitInfo(samples=shards, index=index, table=table)
    write_dir_manifest(folder, Manifest("wds", ["a", "b"], {"train": info}, version=TABLE_VERSION))
    return folder


@pytest.mark.forked  # tracemalloc in a child with one thread (tests/forked.py)
def test_opening_and_pickling_stay_flat_in_the_number_of_shards(tmp_path):
    got = {}
    for shards in (2_000, 200_000):
        folder = sparse_table_dataset(tmp_path / f"{shards}.wds", shards)
        tracemalloc.start()
        try:
            ds = open_dataset(folder)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        got[shards] = (peak, len(pickle.dumps(ds)))
        assert len(ds) == shards and ds.shard_entries()[shards - 1]["name"] == shard_name("train", shards - 1)
    (small_peak, small_sent), (big_peak, big_sent) = got[2_000], got[200_000]
    assert big_peak < 2 << 20 and big_peak < small_peak + (64 << 10), got  # the listed manifest: ~100 MB at 200k
    assert abs(big_sent - small_sent) < 64, got  # the digits of the counts


def test_the_content_fingerprint_follows_the_table(packed_wds, tmp_path):
    folder = tmp_path / "edited.wds"
    shutil.copytree(packed_wds, folder)
    body = json.loads((folder / "manifest.json").read_text())

    def shift(shards):
        shards[0]["samples"] += 1
        shards[1]["samples"] -= 1
    edit_shards(folder, body, shift)
    (folder / "manifest.json").write_text(json.dumps(body))
    again = tmp_path / "again.wds"
    convert(IMAGEFOLDER, again, ConvertOptions(workers=1, progress=False, shard_bytes=64 << 10))
    assert open_dataset(again).fingerprint == open_dataset(packed_wds).fingerprint != open_dataset(folder).fingerprint



def claiming(packed_wds: Path, folder: Path, shards: int) -> Path:
    """A copy of `packed_wds` whose manifest claims `shards` shards in its train table (of the size they take)."""
    shutil.copytree(packed_wds, folder)
    body = json.loads((folder / "manifest.json").read_text())
    body["splits"]["train"]["table"].update(shards=shards, bytes=Layout(shards).size)
    (folder / "manifest.json").write_text(json.dumps(body))
    return folder


@pytest.fixture
def logged_s3(s3):
    """moto's S3 server, noting (method, Range header) of every request of a shard table."""
    seen: list[tuple[str, str]] = []
    app = s3.server.app

    def logged(environ, start_response):
        if environ["PATH_INFO"].endswith(".shards.bin"):
            seen.append((environ["REQUEST_METHOD"], environ.get("HTTP_RANGE", "")))
        return app(environ, start_response)
    s3.server.app = logged
    return s3, seen


def uploaded(s3, seen: list, folder: Path) -> str:
    url = s3.bucket("data") + f"/{folder.name}"
    upload_folder(folder, url)
    seen.clear()  # the uploads
    return url


@pytest.mark.parametrize("shards", [10 ** 10, 10 ** 11])
def test_a_count_past_what_a_table_holds_is_refused_before_any_of_it_is_read(logged_s3, packed_wds, tmp_path, shards):
    """Issue #47: the head a crafted count implies (703 MB at 10**10) was asked for whole, and held twice."""
    s3, seen = logged_s3
    url = uploaded(s3, seen, claiming(packed_wds, tmp_path / "crafted.wds", shards))
    with pytest.raises(ShardTableDamaged, match=rf"^{url}/train.shards.bin: the manifest claims {shards:,} shards, a "
                                                rf"table holds at most 1,000,000,000 \(a shard's number has nine "
                                                rf"digits\){ONE_LINE}"):
        open_dataset(url, cache_dir=tmp_path / "cache")
    assert seen == []


def test_a_big_head_is_read_only_from_a_table_of_the_size_its_count_implies(logged_s3, packed_wds, tmp_path):
    s3, seen = logged_s3
    real = (packed_wds / "train.shards.bin").stat().st_size
    url = uploaded(s3, seen, claiming(packed_wds, tmp_path / "crafted.wds", 10 ** 8))
    layout = Layout(10 ** 8)
    assert layout.head > READ_CHUNK
    with pytest.raises(ShardTableDamaged, match=rf"^{url}/train.shards.bin: the manifest claims 100,000,000 shards, "
                                                rf"a table of {layout.size:,} bytes; the store holds {real:,} "
                                                rf"bytes{ONE_LINE}"):
        open_dataset(url, cache_dir=tmp_path / "cache")
    assert seen == [("HEAD", "")]  # its size, and nothing of it


def test_a_table_is_read_from_a_store_in_bounded_chunks(logged_s3, packed_wds, tmp_path, monkeypatch):
    """The head and the `first` column come READ_CHUNK at a time (here 64 bytes; blocks stay whole)."""
    monkeypatch.setattr(shard_table, "READ_CHUNK", 64)
    s3, seen = logged_s3
    url = uploaded(s3, seen, Path(shutil.copytree(packed_wds, tmp_path / "fixture.wds")))
    local = open_dataset(packed_wds)
    layout = Layout(len(local.shard_entries()))
    assert layout.head > 64 and layout.rows_at - layout.first_at <= 8 * BLOCK_ROWS
    ds = open_dataset(url, cache_dir=tmp_path / "cache")
    head = [f"bytes={a}-{min(a + 64, layout.head) - 1}" for a in range(0, layout.head, 64)]
    assert seen == [("HEAD", "")] + [("GET", r) for r in head]
    assert ds.shard_sizes().tolist() == local.shard_sizes().tolist()
    assert seen[-1] == ("GET", f"bytes={layout.first_at}-{layout.rows_at - 1}")  # one block: the smallest whole piece
    assert records(ds) == records(local)


@pytest.mark.forked  # tracemalloc in a child with one thread (tests/forked.py)
def test_a_local_table_claiming_a_crafted_count_is_refused_in_one_line_without_memory(packed_wds, tmp_path):
    folder = claiming(packed_wds, tmp_path / "crafted.wds", 10 ** 11)
    where = re.escape(str(folder / "train.shards.bin"))
    open_dataset(packed_wds)  # what the first open imports is not counted
    tracemalloc.start()
    try:
        with pytest.raises(ShardTableDamaged, match=f"^{where}: the manifest claims 100,000,000,000 shards, a table "
                                                    f"holds at most 1,000,000,000 .*{ONE_LINE}"):
            open_dataset(folder)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2 << 20, peak  # as an honest open (~1 MiB: the manifest's read); the head claimed: 7 GB


SPARSE_UNDER_A_CAP = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
from datapipe.formats import open_dataset
try:
    open_dataset(sys.argv[1])
except ValueError as exc:
    sys.exit(str(exc))
"""


def test_a_table_past_the_address_space_is_read_unmapped_in_chunks(packed_wds, tmp_path):
    """A 5.2 GB (sparse) table of the size its count implies, under a 3 GiB address-space cap (ulimit -v):
    the map fails, the 7 MB head comes by pread in chunks and is refused by its sha256, in one line (the
    map's OSError was a traceback)."""
    folder = claiming(packed_wds, tmp_path / "sparse.wds", 10 ** 8)
    with open(folder / "train.shards.bin", "r+b") as fh:
        fh.truncate(Layout(10 ** 8).size)
    done = subprocess.run([sys.executable, "-c", SPARSE_UNDER_A_CAP, str(folder)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 1 and done.stdout == "", done.stderr
    assert re.fullmatch(f"{re.escape(str(folder / 'train.shards.bin'))}: its head differs from the manifest's "
                        f"head_sha256{ONE_LINE}\n", done.stderr), done.stderr
