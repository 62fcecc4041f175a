"""Foreign tar shards from strangers (issue #25, part 3): each crafted header is a one-line error that
names the shard and the byte, or a member skipped with its reason; memory stays bounded by the
shard's real size. The tars are built byte by byte."""
from __future__ import annotations

import os
import re
import tracemalloc

import pytest

from datapipe.formats.tar import BLOCK, padded, parse_idx, scan_tar
from datapipe.formats.wds_foreign import ForeignShardsDataset

pytestmark = pytest.mark.forked  # tracemalloc in a child with one thread (tests/forked.py)

TB = 1 << 40
JPEG = b"\xff\xd8\xff\xe0" + b"\x11" * 9000 + b"\xff\xd9"  # bytes only: nothing decodes here


def header(name: bytes, size: int | bytes, kind: bytes = b"0", *, checksum_ok: bool = True) -> bytes:
    """A raw USTAR header; `size` an int (octal, GNU base-256 from 8 GiB) or the raw 12-byte field."""
    if isinstance(size, int):
        size = b"%011o\0" % size if size < 8 ** 11 else b"\x80" + size.to_bytes(11, "big")
    head = (name.ljust(100, b"\0") + b"0000644\0" + b"0000000\0" * 2 + size + b"%011o\0" % 0 + b" " * 8 + kind
            + b"\0" * 100 + b"ustar\x0000").ljust(BLOCK, b"\0")
    return head[:148] + b"%06o\0 " % (sum(head) + (0 if checksum_ok else 1)) + head[156:]


def member(name: bytes, data: bytes, kind: bytes = b"0") -> bytes:
    return header(name, len(data), kind) + data + b"\0" * (padded(len(data)) - len(data))


def pax(kind: bytes = b"x", **records: bytes) -> bytes:
    """A PAX extended header ('x', or 'g' global) holding `records` (`LEN key=value\\n` each)."""
    body = b""
    for key, value in records.items():
        rest = b" %s=%s\n" % (key.encode(), value)
        length = len(rest) + len(str(len(rest)))
        length += len(str(length)) - len(str(len(rest)))
        body += b"%d" % length + rest
    return member(b"PaxHeaders/x", body, kind)


GOOD = member(b"good.jpg", JPEG) + member(b"good.cls", b"1")
END = b"\0" * 2 * BLOCK


def shard(tmp_path, *parts: bytes, end: bool = True) -> str:
    path = tmp_path / "shard-000000.tar"
    path.write_bytes(GOOD + b"".join(parts) + (END if end else b""))
    return str(path)


def scan(path: str):
    """scan_tar, asserting it allocated no more than the shard's size (plus 64 KiB) at its peak."""
    tracemalloc.start()
    try:
        return scan_tar(path)
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        size = os.path.getsize(path)
        assert peak < size + (64 << 10), f"{peak:,} bytes allocated for a {size:,} byte shard"


def damaged(path: str, byte: int, what: str) -> str:
    return rf"^{re.escape(path)}: .*{what}.* at byte {byte}; the shard is damaged"


@pytest.mark.parametrize("parts", [
    (member(b"../../etc/x.jpg", JPEG), member(b"../../etc/x.cls", b"0")),
    (member(b"/abs/x.jpg", JPEG), member(b"/abs/x.cls", b"0")),
    (pax(path=b"a/../../x.jpg"), member(b"plain.jpg", JPEG), pax(path=b"/x.cls"), member(b"plain.cls", b"0")),
    (member(b"././@LongLink", b"../" * 40 + b"x.jpg", b"L"), member(b"short.jpg", JPEG)),
], ids=["dotdot", "absolute", "pax-path", "gnu-longname"])
def test_members_named_outside_the_shard_are_skipped_with_their_reason(tmp_path, caplog, parts):
    path = shard(tmp_path, *parts)
    assert [[c[3] for c in s] for s in scan(path)] == [["good.jpg", "good.cls"]]
    assert re.search(rf"{re.escape(path)}: skipped \d tar member\(s\), first byte {len(GOOD)}: tar member name "
                     r"'.* is not a plain relative name .*(\.\.|absolute)", caplog.text)


def test_a_foreign_dataset_serves_only_the_safe_samples(tmp_path):
    path = shard(tmp_path, member(b"../../etc/x.jpg", JPEG), member(b"../../etc/x.cls", b"0"))
    ds = ForeignShardsDataset(path, cache_dir=tmp_path / "cache")
    assert [ds.record(i).key for i in range(len(ds))] == ["good"]


@pytest.mark.parametrize("size", [TB, 8 ** 11 - 1], ids=["1TB-base256", "8GB-octal"])
@pytest.mark.parametrize("kind", [b"0", b"7", b"Z"], ids=["file", "contiguous", "unknown-type"])
def test_a_member_claiming_more_than_the_file_is_an_error(tmp_path, size, kind):
    path = shard(tmp_path, header(b"big.jpg", size, kind) + JPEG[:1024])
    with pytest.raises(ValueError, match=damaged(path, len(GOOD), f"claims {size} bytes past the end")):
        scan(path)


@pytest.mark.parametrize("kind", [b"L", b"x", b"K"], ids=["gnu-longname", "pax", "gnu-longlink"])
@pytest.mark.parametrize("size", [TB, 64 << 20], ids=["1TB", "64MB"])
def test_an_extended_header_claiming_megabytes_is_an_error_not_an_allocation(tmp_path, kind, size):
    path = shard(tmp_path, header(b"././@LongLink", size, kind) + b"n" * BLOCK, member(b"x.jpg", JPEG))
    claim = rf"extended header \('{kind.decode()}'\) claims {size}"
    with pytest.raises(ValueError, match=damaged(path, len(GOOD), claim)):
        scan(path)


def test_a_file_that_ends_inside_a_header_is_an_error(tmp_path):
    path = shard(tmp_path, member(b"x.jpg", JPEG), header(b"x.cls", 1)[:300], end=False)
    byte = len(GOOD) + BLOCK + padded(len(JPEG))
    with pytest.raises(ValueError, match=damaged(path, byte, "ends inside a tar header")):
        scan(path)


@pytest.mark.parametrize("first", [True, False], ids=["first-header", "mid-shard"])
def test_a_header_failing_its_checksum_is_an_error_not_the_end_of_the_shard(tmp_path, first):
    bad = header(b"x.jpg", len(JPEG), checksum_ok=False) + JPEG + b"\0" * (padded(len(JPEG)) - len(JPEG))
    path = shard(tmp_path, bad, member(b"x.cls", b"2"))
    if first:
        (tmp_path / "shard-000000.tar").write_bytes(bad + GOOD + END)
    with pytest.raises(ValueError, match=damaged(path, 0 if first else len(GOOD), "fails its checksum")):
        scan(path)


@pytest.mark.parametrize("records", [
    {"size": b"-1"}, {"size": b"abc"}, {"size": b""}, {"size": b"1000000000000"}, {"size": b"1e3"},
], ids=["negative", "non-numeric", "empty", "1TB", "float"])
def test_odd_pax_sizes_are_errors(tmp_path, records):
    path = shard(tmp_path, pax(**records), member(b"x.jpg", JPEG), member(b"x.cls", b"2"))
    with pytest.raises(ValueError, match=damaged(path, len(GOOD), "(PAX size .* is not a size|claims)")):
        scan(path)


@pytest.mark.parametrize("body", [b"99999 path=x.jpg\n", b"12 pathx.jpg\n", b"x path=y\n", b"5 a=b\n"],
                         ids=["length-past-end", "no-equals", "non-numeric-length", "short-length"])
def test_malformed_pax_records_are_errors(tmp_path, body):
    path = shard(tmp_path, member(b"PaxHeaders/x", body, b"x"), member(b"x.jpg", JPEG))
    with pytest.raises(ValueError, match=damaged(path, len(GOOD), "PAX record .* is malformed")):
        scan(path)


def test_a_sparse_map_claiming_a_billion_regions_is_skipped_unread(tmp_path, caplog):
    sparse = pax(**{"GNU.sparse.major": b"1", "GNU.sparse.minor": b"0", "GNU.sparse.name": b"s.jpg",
                    "GNU.sparse.realsize": b"%d" % TB})
    path = shard(tmp_path, sparse, member(b"s.jpg", b"1000000000\n"))
    assert [[c[3] for c in s] for s in scan(path)] == [["good.jpg", "good.cls"]]
    assert "'s.jpg' is a sparse file, which datapipe does not read" in caplog.text


def test_an_index_claiming_a_billion_samples_is_an_error():
    with pytest.raises(ValueError, match=r"^index: claims 1000000000 samples but lists 1; the index is damaged"):
        parse_idx("v1.2 1000000000\njpg 512 10 a.jpg cls 1536 1 a.cls\n")


@pytest.mark.parametrize("line", ["jpg 512 10 ../../a.jpg", "jpg 512 10 /a.jpg", "jpg 0 10 a.jpg",
                                  "jpg 512 -10 a.jpg", "jpg 512", "jpg x 10 a.jpg"])
def test_an_index_line_that_describes_no_member_is_an_error(line):
    with pytest.raises(ValueError, match=r"^index: line 2 \(.*\) does not describe a member; the index is damaged"):
        parse_idx(f"v1.2 1\n{line}\n")


def test_an_index_line_past_the_end_of_its_tar_is_an_error():
    with pytest.raises(ValueError, match=r"^s\.idx: line 2 \(.*\) does not describe a member of the 10240-byte tar"):
        parse_idx("v1.2 1\njpg 512 1099511627776 a.jpg\n", where="s.idx", shard_bytes=10240)


def test_a_stranger_s_idx_beside_the_shard_is_checked_against_the_tar(tmp_path):
    """The dataset reads a DALI `.idx` beside a shard when there is one: a `.cls` it places 1 TB
    into the file made the index build pread 1 TB; non-ASCII bytes gave a UnicodeDecodeError."""
    path = shard(tmp_path)
    idx = tmp_path / "shard-000000.idx"
    idx.write_text(f"v1.2 1\njpg 512 {len(JPEG)} good.jpg cls {TB} 1 good.cls\n")
    with pytest.raises(ValueError, match=rf"^{re.escape(str(idx))}: line 2 .* does not describe a member of the"):
        ForeignShardsDataset(path, cache_dir=tmp_path / "cache")
    idx.write_bytes(b"v1.2 1\njpg 512 9 g\xff\xfe.jpg\n")
    with pytest.raises(ValueError, match=rf"^{re.escape(str(idx))}: byte \d+ is not ASCII"):
        ForeignShardsDataset(path, cache_dir=tmp_path / "cache")


def test_members_written_from_inside_their_folder_keep_their_samples(tmp_path):
    """`tar -cf shard.tar .` names every member `./NAME`: a plain name, not one that climbs out."""
    path = tmp_path / "dot.tar"
    path.write_bytes(member(b"./a.jpg", JPEG) + member(b"./a.cls", b"3") + END)
    assert [[c[3] for c in s] for s in scan(str(path))] == [["a.jpg", "a.cls"]]
    ds = ForeignShardsDataset(str(path), cache_dir=tmp_path / "cache")
    record = ds.record(0)
    assert (len(ds), record.key, record.label, record.data) == (1, "a", 3, JPEG)
