"""Every source x backend: exact coverage with labels, per-epoch order, rank sharding, resume."""
import pytest
import torch

from datapipe import make_loader, open_dataset

BACKENDS = ["dataloader", "prefetch", "dali"]
SMALL = dict(batch_size=5, image_size=32, num_workers=1)


def epoch_indices(loader, epoch=0):
    loader.set_epoch(epoch)
    batches = []
    for images, labels, indices in loader:
        assert images.shape[1:] == (3, 32, 32) and images.dtype == torch.float32
        assert labels.dtype == torch.int64 and len(labels) == len(indices) == len(images)
        batches.append((indices.tolist(), labels.tolist()))
    return batches


def flat(batches):
    return [i for idx, _ in batches for i in idx]


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_epoch_every_record_once_with_its_label_then_a_new_order(source, backend):
    ds = open_dataset(source) if not isinstance(source, str) else open_dataset(source)
    loader = make_loader(source, backend=backend, **SMALL)
    assert loader.backend == backend
    first = epoch_indices(loader, 0)
    assert len(first) == len(loader)
    assert sorted(flat(first)) == list(range(len(ds)))
    for indices, labels in first:
        assert labels == [ds[i].label for i in indices]
    second = epoch_indices(loader, 1)
    assert sorted(flat(second)) == list(range(len(ds))) and flat(second) != flat(first)
    assert flat(epoch_indices(loader, 0)) == flat(first)  # seeded: the same epoch repeats exactly


@pytest.mark.parametrize("batch_size", [5, 13])  # 13: shards of 13 and 14 records straddle a batch boundary
@pytest.mark.parametrize("backend", BACKENDS)
def test_two_ranks_get_equal_batch_counts_and_cover_everything(source, backend, batch_size):
    size = len(open_dataset(source))
    options = {**SMALL, "batch_size": batch_size}
    ranks = [epoch_indices(make_loader(source, backend=backend, rank=r, world_size=2, **options)) for r in (0, 1)]
    assert len(ranks[0]) == len(ranks[1])
    assert set(flat(ranks[0])) | set(flat(ranks[1])) == set(range(size))
    assert len(flat(ranks[0])) + len(flat(ranks[1])) <= size + 1  # at most one padded repeat


@pytest.mark.parametrize("backend", BACKENDS)
def test_resume_mid_epoch_yields_exactly_the_rest(source, backend):
    whole = flat(epoch_indices(make_loader(source, backend=backend, **SMALL), 3))
    loader = make_loader(source, backend=backend, **SMALL)
    loader.set_epoch(3)
    seen = []
    for _, _, indices in loader:
        seen += indices.tolist()
        if len(seen) >= 10:
            break
    state = loader.state_dict()
    assert state["epoch"] == 3 and state["batches_done"] == 2
    resumed = make_loader(source, backend=backend, **SMALL)
    resumed.load_state_dict(state)
    rest = [i for _, _, idx in resumed for i in idx.tolist()]
    assert seen + rest == whole


def test_resume_refuses_a_state_from_another_configuration(packed_lmdb):
    state = make_loader(packed_lmdb, backend="dataloader", **SMALL).state_dict()
    with pytest.raises(ValueError, match="batch_size"):
        make_loader(packed_lmdb, backend="dataloader", **{**SMALL, "batch_size": 7}).load_state_dict(state)


def test_dali_external_source_survives_pickling_for_spawned_workers(source):
    """On a GPU DALI starts its source workers with spawn: the callable and its dataset must pickle
    (without open handles) and read correctly in the new process."""
    import pickle
    from types import SimpleNamespace

    import numpy as np

    from datapipe.dali_source import PlannedBatches

    ds = open_dataset(source)
    source_fn = pickle.loads(pickle.dumps(PlannedBatches(ds, [np.array([2, 0]), np.array([1])])))
    images, labels, indices = source_fn(SimpleNamespace(iteration=0))
    assert [bytes(i) for i in images] == [ds[2].data, ds[0].data]
    assert [int(l) for l in labels] == [ds[2].label, ds[0].label] and [int(i) for i in indices] == [2, 0]
    with pytest.raises(StopIteration):
        source_fn(SimpleNamespace(iteration=2))
