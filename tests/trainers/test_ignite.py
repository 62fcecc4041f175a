"""PyTorch Ignite with the real library (idist.Parallel, 2 spawned ranks, gloo): docs/examples/ignite_train.py
trains with create_supervised_trainer's default prepare_batch on batch_format="pair" batches, and resumes
from its own Checkpoint files through Checkpoint.load_objects, mid-epoch and at an epoch's end, with
Engine and with DeterministicEngine, and with Engine over a datapipe.Mix (tests/trainers/ignite_run.py runs
them all in one launch)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

import datapipe
from datapipe import open_dataset
from tests.conftest import installed
from tests.trainers.mixed import data_of, mix_spec
from tests.trainers.reference import EPOCHS, check_coverage, check_mix_coverage, each_once, unbroken
from tests.trainers.served import MID_STEP, STEPS_PER_EPOCH, run_to_end

if not installed("ignite"):  # found, not imported: no pytest worker imports it at collection
    pytest.skip("pytorch-ignite is not installed", allow_module_level=True)
SCRIPT = Path(__file__).with_name("ignite_run.py")
DOCS = Path(__file__).parents[2] / "docs"
TIMEOUT_S = 240


@pytest.fixture(scope="module")
def served(packed_lmdb, packed_wds, tmp_path_factory) -> dict[str, list[dict]]:
    """Per run ("engine/whole", "deterministic/resumed-6", "mix/whole", ...): both ranks' records, with their rank."""
    out = tmp_path_factory.mktemp("ignite")
    run_to_end([sys.executable, str(SCRIPT), str(packed_lmdb), str(out), mix_spec(packed_lmdb, packed_wds)], TIMEOUT_S)
    runs: dict[str, list[dict]] = {}
    for rank in (0, 1):
        for line in (out / f"served-rank{rank}.jsonl").read_text().splitlines():
            record = json.loads(line)
            runs.setdefault(record["run"], []).append({**record, "rank": rank})
    return runs


@pytest.fixture(scope="module")
def reference(packed_lmdb):
    return unbroken(packed_lmdb)


@pytest.fixture(scope="module")
def mix_reference(packed_lmdb, packed_wds):
    mix = data_of(mix_spec(packed_lmdb, packed_wds))
    return mix, unbroken(mix)


def batches(records: list[dict], reference) -> list[tuple[int, int, int]]:
    """The (rank, epoch, batch) each record trained on, checked against the unbroken loader's batch
    there (labels, pixels) and against Ignite's own count (no drift)."""
    found = []
    for r in records:
        key = (r["rank"], r["epoch"], r["done"])
        assert (r["labels"], r["pixels"]) == tuple(reference[key][1:3]), key
        assert r["ignite_epoch"] == r["epoch"] + 1 and r["iteration"] == r["epoch"] * STEPS_PER_EPOCH + r["done"], r
        found.append(key)
    return found


def test_the_page_quotes_the_example_whole():
    assert (DOCS / "examples" / "ignite_train.py").read_text().rstrip("\n") in (DOCS / "trainers.md").read_text()


@pytest.mark.parametrize("kind", ["engine", "deterministic"])
def test_default_prepare_batch_trains_each_epoch_complete_disjoint_and_new(served, reference, packed_lmdb, kind):
    check_coverage(reference, len(open_dataset(packed_lmdb)))
    each_once(batches(served[f"{kind}/whole"], reference), reference)


@pytest.mark.parametrize("step", [MID_STEP, STEPS_PER_EPOCH])
@pytest.mark.parametrize("kind", ["engine", "deterministic"])
def test_load_objects_resumes_exactly_where_the_checkpoint_was_taken(served, reference, kind, step):
    whole = [r for r in served[f"{kind}/whole"] if r["iteration"] <= step]
    each_once(batches(whole + served[f"{kind}/resumed-{step}"], reference), reference)


def test_over_a_mix_load_objects_resumes_mid_epoch_and_each_batch_is_trained_once(served, mix_reference):
    """Over a Mix (tests/trainers/mixed.py), Engine's whole run and its resumption from the mid-epoch
    checkpoint (both at world size 2: Ignite's checkpoint holds its epoch_length, batches a rank, so
    another world size would end its epochs where the old one did): each step's labels (indices into
    mix.classes) and crops are the unbroken loader's, whose (source, record, label) are the mix's
    uninterrupted sequence; every batch once, none twice."""
    mix, reference = mix_reference
    check_mix_coverage(reference, mix)
    each_once(batches(served["mix/whole"], reference), reference)
    whole = [r for r in served["mix/whole"] if r["iteration"] <= MID_STEP]
    each_once(batches(whole + served[f"mix/resumed-{MID_STEP}"], reference), reference)


def test_deterministic_engine_given_a_restored_loader_skips_the_batches_it_reads_again(served, reference):
    """What docs/trainers.md warns of: DeterministicEngine re-reads the batches of the epoch done
    before the checkpoint, from a loader that had resumed after them; both ranks lose the rest of
    epoch 1 and Ignite's epochs drift from the loader's."""
    naive = served["naive"]
    assert {(r["epoch"], r["done"]) for r in naive}.isdisjoint({(1, 3), (1, 4)})
    first = [r for r in naive if r["iteration"] == MID_STEP + 1]
    assert len(first) == 2 and all((r["ignite_epoch"], r["epoch"], r["done"]) == (2, 2, 1) for r in first)


def test_pair_batches_are_the_first_two_fields_of_the_default_batch(packed_lmdb):
    options = dict(batch_size=4, image_size=8, rank=0, world_size=2, device="cpu")
    pairs = datapipe.make_loader(packed_lmdb, batch_format="pair", **options)
    default = datapipe.make_loader(packed_lmdb, **options)
    for pair, batch in zip(pairs, default, strict=True):
        assert type(pair) is tuple and len(pair) == 2 and isinstance(batch, datapipe.Batch)
        assert torch.equal(pair[0], batch.images) and torch.equal(pair[1], batch.labels)
    assert pairs.state_dict() == default.state_dict()
    with pytest.raises(ValueError, match=r"batch_format must be one of \('batch', 'pair'\).*got 'triple'"):
        datapipe.make_loader(packed_lmdb, batch_format="triple", **options)


@pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")  # Ignite's import, here rather than at collection
def test_the_default_prepare_batch_takes_pairs_and_refuses_three_fields(packed_lmdb):
    from ignite.engine import create_supervised_trainer

    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 8 * 8, 3))
    trainer = create_supervised_trainer(model, torch.optim.SGD(model.parameters(), lr=0.1),
                                        torch.nn.functional.cross_entropy)
    options = dict(batch_size=4, image_size=8, rank=0, world_size=2, device="cpu")
    assert trainer.run(datapipe.make_loader(packed_lmdb, batch_format="pair", **options)).iteration == STEPS_PER_EPOCH
    with pytest.raises(ValueError, match=r"too many values to unpack \(expected 2"):
        trainer.run(datapipe.make_loader(packed_lmdb, **options), max_epochs=1)
