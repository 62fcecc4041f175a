"""A converted LMDB file holds the dataset's records and zeroes, never leftovers of the converting
process's heap: LMDB writes whole pages, and with meminit off their unused bytes were whatever the
heap held (found when a suite run's flipped byte hit such a stale copy instead of the record)."""
from converters import ConvertOptions, convert
from tests.conftest import IMAGEFOLDER

SECRET = b"AWS_SECRET_ACCESS_KEY=hunter2-"


def test_a_converted_lmdb_holds_none_of_what_the_process_had_in_memory(tmp_path):
    held = [SECRET * (n % 500 + 10) + bytes([n % 251]) for n in range(20_000)]  # a heap full of it, then freed
    del held
    out = tmp_path / "out.lmdb"
    convert(IMAGEFOLDER, out, ConvertOptions(workers=2, progress=False, shard_bytes=64 << 10))  # many commits
    assert SECRET not in (out / "data.mdb").read_bytes()
