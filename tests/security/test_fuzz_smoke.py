"""The seeded mutation pass of the fuzz targets (fuzz/targets.py), in seconds and without atheris:
each target replays its seeds and every saved finding (fuzz/findings/TARGET/), then checks a few
hundred deterministic mutants (bit flips, cuts, inserted bytes and markers, splices of seeds).
`make fuzz` runs the same checks coverage-guided for minutes (fuzz/README.md)."""
from __future__ import annotations

import random
import tracemalloc
from pathlib import Path

import pytest

from fuzz.targets import PARAM_BYTES, ROOT, TARGETS, mutate, run_checked

pytestmark = pytest.mark.forked  # tracemalloc in a child with one thread (tests/forked.py)

MUTANTS = {"jpeg_markers": 3000, "jpeg_region": 1500, "tar": 1000, "idx": 3000, "manifest": 1000, "parquet": 600}
MUTANTS["sidecars"] = 400  # an image folder's caption / metadata sidecars (#38 row 3)
MUTANTS["shard_table"] = 1500  # a .wds split's shards.bin under an entry that agrees with it (#40 item 5)
MUTANTS["mix_state"] = 1500  # a loader state's mix block (#47 row 10)
MUTANTS["size_schedule"] = 1500  # the --image-size-schedule file (#47 rows 5-6)


def findings(name: str) -> list[bytes]:
    folder = ROOT / "fuzz" / "findings" / name
    return [p.read_bytes() for p in sorted(folder.glob("*")) if p.is_file()] if folder.is_dir() else []


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_seeded_mutants_break_no_oracle(name):
    tracemalloc.start()  # the oracles read the peak; in the forked child (pytestmark), its only thread
    try:
        check_mutants(name)
    finally:
        tracemalloc.stop()


def check_mutants(name: str) -> None:
    if name == "jpeg_region":
        pytest.importorskip("datapipe._jpeg_region", reason="the region decoder was not built (no libjpeg headers)")
    target, rng = TARGETS[name], random.Random(f"fuzz-smoke-{name}")
    seeds = target.seeds()
    inputs = seeds + findings(name) + [mutate(rng.choice(seeds), seeds, rng, PARAM_BYTES.get(name, 0))
                                       for _ in range(MUTANTS[name])]
    for i, data in enumerate(inputs):
        try:
            run_checked(target, data)
        except Exception as exc:  # noqa: BLE001 - the oracle's verdict
            pytest.fail(f"{name} input {i} ({len(data)} bytes, {data[:64].hex()}...): {type(exc).__name__}: {exc}\n"
                        f"save it under fuzz/findings/{name}/ to replay it", pytrace=False)
    assert len(inputs) > len(seeds), name
