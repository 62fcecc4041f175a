"""Other tools' shards from strangers (issue #38 rows 2, 7, 8): a `.cls` id of 10^9 (it built the class list
"0" .. 10^9, 23 GB), a key whose image repeats (`K.jpg`, `K.txt`, `K.jpg`: image B served with A's caption,
A dropped, nothing said) and a brace pattern of 10^12 names (a MemoryError after 70 s). Read in place and
converted, each is a bad sample reported with its shard and member, or a one-line refusal before any work."""
from __future__ import annotations

import contextlib
import io
import logging
import re
import resource
import tarfile
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from converters.tar_shards import scan_tar_shards
from datapipe.formats.braces import MAX_SHARDS
from datapipe.formats.tar import BLOCK, member_header, members, padded, samples_before_damage, walk_tar
from datapipe.formats.wds_foreign import ForeignShardsDataset, expand_shards, parse_cls
from datapipe.records import MAX_INFERRED_CLASSES

pytestmark = pytest.mark.forked  # tracemalloc in a child with one thread (tests/forked.py)

IMAGE_A = b"\xff\xd8\xff\xe0" + b"A" * 3000 + b"\xff\xd9"  # bytes only: nothing decodes here
IMAGE_B = b"\xff\xd8\xff\xe0" + b"B" * 5000 + b"\xff\xd9"
BILLION = 10 ** 9


def write_tar(path: Path, entries: list[tuple[str, bytes]]) -> str:
    """A USTAR tar of `entries` (name, data) in order, names repeated as given."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in entries:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return str(path)


@contextlib.contextmanager
def bounded_memory(extra: int = 1 << 30):
    """The process's address space capped at its size now plus `extra` while the block runs: a class list
    built in full is a MemoryError after 1 GiB, never 23 GB taken from the machine."""
    with open("/proc/self/status") as fh:
        size = next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmSize:"))
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = size + extra if hard == resource.RLIM_INFINITY else min(hard, size + extra)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def peak_of(call):
    """`call()`'s result and the peak bytes Python allocated while it ran."""
    tracemalloc.start()
    try:
        return call(), tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


HUGE_LABELS = [("good.jpg", IMAGE_A), ("good.cls", b"2"), ("huge.jpg", IMAGE_B), ("huge.cls", b"%d" % BILLION),
               ("edge.jpg", IMAGE_B), ("edge.cls", b"1 %d" % MAX_INFERRED_CLASSES), ("last.jpg", IMAGE_A)]


# -- row 2: a .cls id of 10^9 ------------------------------------------------------------------------------


@pytest.mark.parametrize("text", [b"%d" % BILLION, b"3 %d" % MAX_INFERRED_CLASSES, b"9" * 1_000_000])
def test_a_cls_id_at_or_past_the_cap_is_one_line_naming_the_member(text):
    with pytest.raises(ValueError) as caught:
        parse_cls(text, "s.tar: k.cls")
    message = str(caught.value)
    assert re.match(rf"s\.tar: k\.cls holds class id \d+\.*, past the cap of {MAX_INFERRED_CLASSES:,} classes for "
                    r"shards without a class list \(datapipe\.records\.MAX_INFERRED_CLASSES\)", message), message
    assert len(message) < 300 and "\n" not in message
    assert parse_cls(b"%d" % (MAX_INFERRED_CLASSES - 1), "k.cls") == (MAX_INFERRED_CLASSES - 1,)


def test_read_in_place_a_cls_id_of_a_billion_skips_its_sample_and_builds_no_class_list(tmp_path, caplog):
    shard = write_tar(tmp_path / "s-000.tar", HUGE_LABELS)
    with bounded_memory():
        ds, peak = peak_of(lambda: ForeignShardsDataset(shard, cache_dir=tmp_path / "cache"))
    assert ds.classes == ["0", "1", "2"] and len(ds) == 2
    assert [ds[i][:3:2] for i in range(len(ds))] == [("good", 2), ("last", -1)]
    assert peak < 4 << 20, peak
    assert re.search(rf"skipped 2 sample\(s\) whose \.cls holds no usable class ids, the first: {re.escape(shard)}: "
                     rf"huge\.cls holds class id {BILLION}, past the cap", caplog.text)


def test_converted_a_cls_id_of_a_billion_skips_its_sample_with_the_shard_and_member(tmp_path):
    shard = write_tar(tmp_path / "shards/s-000.tar", HUGE_LABELS)
    with bounded_memory():
        layout, peak = peak_of(lambda: scan_tar_shards(shard))
    assert layout.classes.classes == ("0", "1", "2") and peak < 4 << 20, peak
    assert [f.label for f in layout.splits["train"]] == [2, -1]
    skipped = {s["path"]: s["reason"] for s in layout.skipped["train"]}
    assert sorted(skipped) == ["s-000.tar:edge.jpg", "s-000.tar:huge.jpg"]
    assert skipped["s-000.tar:huge.jpg"].startswith(f"its .cls member holds class id {BILLION}, past the cap")


def test_a_cached_index_claiming_a_billion_classes_is_rebuilt_not_believed(tmp_path):
    shard = write_tar(tmp_path / "s-000.tar", HUGE_LABELS[:2])
    ForeignShardsDataset(shard, cache_dir=tmp_path / "cache")
    [cached] = (tmp_path / "cache/index").glob("*.npz")
    arrays = dict(np.load(cached))
    np.savez(cached, **{**arrays, "classes": np.array([BILLION], np.int64)})
    with bounded_memory():
        ds = ForeignShardsDataset(shard, cache_dir=tmp_path / "cache")
    assert ds.classes == ["0", "1", "2"] and len(ds) == 1


# -- row 7: a key whose image repeats ----------------------------------------------------------------------

TWICE = [("good.jpg", IMAGE_A), ("good.txt", b"good"), ("K.jpg", IMAGE_A), ("K.txt", b"caption of A"),
         ("K.jpg", IMAGE_B), ("next.jpg", IMAGE_B), ("next.txt", b"next")]
TWICE_REASON = (r"members 'K\.jpg' and 'K\.jpg' \(data at bytes (\d+) and (\d+)\) share the extension 'jpg' in one "
                r"sample; which of them its other members go with cannot be told, so the sample is not read")


def test_a_key_whose_image_repeats_is_refused_whole_naming_both_members(tmp_path):
    shard = write_tar(tmp_path / "s-000.tar", TWICE)
    groups, skipped, damage = samples_before_damage(shard)
    assert [[c[3] for c in g] for g in groups] == [["good.jpg", "good.txt"], ["next.jpg", "next.txt"]]
    assert damage is None and len(skipped) == 1
    found = {name: offset for name, offset, _ in walk_tar(shard)[0] if name != "K.jpg"}
    a, b = (offset for name, offset, _ in walk_tar(shard)[0] if name == "K.jpg")
    match = re.search(TWICE_REASON, skipped[0])
    assert match and (int(match[1]), int(match[2])) == (a, b) and found, skipped


def test_a_shard_cut_short_after_such_a_key_drops_it_as_the_cut_sample_and_keeps_the_one_before(tmp_path):
    shard = write_tar(tmp_path / "s-000.tar", TWICE[:5] + [("tail.jpg", IMAGE_B)])
    tail = next(offset for name, offset, _ in walk_tar(shard)[0] if name == "tail.jpg")
    with open(shard, "r+b") as fh:
        fh.truncate(tail + 100)  # inside the last member's data
    groups, skipped, damage = samples_before_damage(shard)
    assert [[c[3] for c in g] for g in groups] == [["good.jpg", "good.txt"]] and damage and not skipped


def test_read_in_place_a_key_whose_image_repeats_is_left_out_with_a_warning(tmp_path, caplog):
    shard = write_tar(tmp_path / "s-000.tar", TWICE)
    ds = ForeignShardsDataset(shard, cache_dir=tmp_path / "cache")
    assert [(r.key, r.data, r.fields.text) for r in (ds.record(i) for i in range(len(ds)))] == [
        ("good", IMAGE_A, "good"), ("next", IMAGE_B, "next")]
    assert re.search(rf"{re.escape(shard)}: skipped 1 tar member\(s\), first byte \d+: {TWICE_REASON}", caplog.text)


def test_read_in_place_through_a_dali_index_a_key_listed_twice_is_left_out(tmp_path, caplog):
    shard = write_tar(tmp_path / "s-000.tar", TWICE)
    parts = [(name.split(".", 1)[1], offset, size, name) for name, offset, size in walk_tar(shard)[0]]
    lines = [parts[0:2], parts[2:5], parts[5:7]]
    Path(shard[:-4] + ".idx").write_text("v1.2 3\n" + "".join(
        " ".join(f"{e} {o} {s} {n}" for e, o, s, n in line) + "\n" for line in lines))
    ds = ForeignShardsDataset(shard, cache_dir=tmp_path / "cache")
    assert [ds[i].key for i in range(len(ds))] == ["good", "next"]
    assert re.search(TWICE_REASON, caplog.text)


def test_converted_a_key_whose_image_repeats_is_skipped_naming_the_shard_and_both_members(tmp_path):
    shard = write_tar(tmp_path / "shards/s-000.tar", TWICE)
    layout = scan_tar_shards(shard)
    assert [(f.key, f.fields.text) for f in layout.splits["train"]] == [("good", "good"), ("next", "next")]
    [skipped] = layout.skipped["train"]
    assert skipped["path"] == "s-000.tar" and re.search(TWICE_REASON, skipped["reason"]), skipped


def test_a_sample_span_of_this_projects_shards_with_two_images_is_damage():
    blob = b"".join(member_header(name, len(data)) + data + b"\0" * (padded(len(data)) - len(data))
                    for name, data in [("k.jpg", IMAGE_A), ("k.cls", b"1"), ("k.jpg", IMAGE_B)])
    with pytest.raises(ValueError, match=r"^s\.wds: members 'k\.jpg' and 'k\.jpg' share the extension 'jpg' in one "
                                         r"sample; the shard is damaged or was crafted$"):
        members(blob, "s.wds")
    assert members(blob[:3 * BLOCK + padded(len(IMAGE_A))], "s.wds")["jpg"] == ("k.jpg", IMAGE_A)


def test_webdataset_itself_refuses_such_a_tar(tmp_path):
    """What the peer does with the same tar (the behaviour the refusal matches): its grouping raises."""
    webdataset = pytest.importorskip("webdataset")
    shard = write_tar(tmp_path / "s-000.tar", TWICE)
    with pytest.raises(ValueError, match="duplicate file name"):
        list(webdataset.WebDataset(shard, shardshuffle=False))


# -- row 8: a brace pattern of 10^12 names ----------------------------------------------------------------


@pytest.mark.parametrize("pattern, count", [
    ("s-{000000000000..999999999999}.tar", "1,000,000,000,000"),
    ("s-{0..999}-{0..999}-{0..9}.tar", "10,000,000"),
    ("a-{0..999999}.tar::b-{0..9}.tar", "1,000,010"),
    ("{0..9}" * 30 + ".tar", "about 10^30"),
])
def test_a_pattern_past_the_cap_is_refused_in_one_line_before_any_name_is_made(pattern, count, monkeypatch):
    import braceexpand

    monkeypatch.setattr(braceexpand, "braceexpand", lambda *a: pytest.fail("expanded before the refusal"))
    with pytest.raises(ValueError) as caught:
        expand_shards(pattern)
    assert str(caught.value) == (f"shard pattern {pattern!r} names {count} "
                                 f"shards, more than the {MAX_SHARDS:,} one pattern may name (datapipe.formats.braces."
                                 "MAX_SHARDS); check its ranges, or read the shards' folder")


def test_a_pattern_of_a_million_names_none_there_is_refused_at_the_first(tmp_path):
    pattern = f"{tmp_path}/s-{{000000..999999}}.tar"
    (tmp_path / "s-000000.tar").write_bytes(b"")
    result, peak = peak_of(lambda: pytest.raises(FileNotFoundError, expand_shards, pattern))
    assert str(result.value) == (f"{pattern!r} names 1,000,000 shards and shard 2, '{tmp_path}/s-000001.tar', does not "
                                 "exist (check the pattern's ranges)")
    assert peak < 4 << 20, peak  # no list of the million names


@pytest.mark.parametrize("pattern, why", [("s-{0..3.tar", "has unbalanced braces"),
                                          ("s-{0.." + "9" * 5000 + "}.tar", "cannot be expanded (ValueError: ")])
def test_a_pattern_that_cannot_be_expanded_is_one_line(pattern, why):
    with pytest.raises(ValueError, match=re.escape(why)) as caught:
        expand_shards(pattern)
    assert len(str(caught.value)) < 400
