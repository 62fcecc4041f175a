"""Every source x backend: exact coverage with labels, per-epoch order, rank sharding, resume."""
import pytest
import torch

from datapipe import make_loader, open_dataset

BACKENDS = ["dataloader", "threads", "prefetch", "dali"]
SMALL = dict(batch_size=5, image_size=32, num_workers=1)


def epoch_indices(loader, epoch=0):
    loader.set_epoch(epoch)
    batches = []
    for images, labels, indices in loader:
        assert images.shape[1:] == (3, 32, 32) and images.dtype == torch.float32
        assert labels.dtype == torch.int64 and len(labels) == len(indices) == len(images) > 0
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
def test_readme_resume_pattern_keeps_the_position(source, backend):
    """load_state_dict, then the loop's set_epoch(state["epoch"]) at the top of the epoch: the rest
    of the epoch, not the epoch over; the next epoch then starts at its beginning."""
    whole = make_loader(source, backend=backend, **SMALL)
    expected = [flat(epoch_indices(whole, e)) for e in (2, 3)]
    first = make_loader(source, backend=backend, **SMALL)
    first.set_epoch(2)
    seen = [i for _, (_, _, idx) in zip(range(2), first) for i in idx.tolist()]
    resumed = make_loader(source, backend=backend, **SMALL)
    resumed.load_state_dict(first.state_dict())
    got = []
    for epoch in (2, 3):
        resumed.set_epoch(epoch)
        got.append([i for _, _, idx in resumed for i in idx.tolist()])
    assert seen + got[0] == expected[0] and got[1] == expected[1]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("worlds", [(2, 1), (1, 3)])
def test_elastic_resume_at_another_world_size_reads_every_sample_once(source, backend, worlds):
    """Ranks stop after 2 batches at one world size; the job comes back at another: together they
    read every record of the epoch, and only padding repeats one."""
    before, after = worlds
    size = len(open_dataset(source))
    options = {**SMALL, "batch_size": 3}
    seen, state = [], None
    for rank in range(before):
        loader = make_loader(source, backend=backend, rank=rank, world_size=before, **options)
        loader.set_epoch(1)
        seen += [i for _, (_, _, idx) in zip(range(2), loader) for i in idx.tolist()]
        state = loader.state_dict()
    assert state["samples_done"] == 2 * 3 * before
    rest = []
    for rank in range(after):
        loader = make_loader(source, backend=backend, rank=rank, world_size=after, **options)
        loader.load_state_dict({**state, "rank": rank})
        loader.set_epoch(1)
        rest += [i for _, _, idx in loader for i in idx.tolist()]
    assert sorted(set(seen + rest)) == list(range(size))
    assert len(seen) + len(rest) - size < after  # the only repeats are the padding of the last batches


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
    with pytest.raises(ValueError, match="seed=0, this loader has seed=7"):
        make_loader(packed_lmdb, backend="dataloader", **{**SMALL, "seed": 7}).load_state_dict(state)


def test_dali_source_survives_pickling_for_spawned_workers(source, tmp_path):
    """On a GPU DALI starts its source workers with spawn: the callable, its dataset and its epoch
    table must pickle (without open handles) and read correctly in the new process."""
    import pickle
    from types import SimpleNamespace

    from datapipe.backends.dali.source import EpochTable, PlannedSource, ViewSettings
    from datapipe.order.sharding import EpochOrder

    ds = open_dataset(source)
    table = EpochTable.create(tmp_path)
    order = EpochOrder(len(ds), 2, shuffle=False)
    source_fn = pickle.loads(pickle.dumps(PlannedSource(ds, order, table, ViewSettings(32, True, 0, True, True))))
    table.write(0, 0, 4)  # DALI epoch 0 reads epoch 0 from global position 4
    images, labels, indices, *_, replaced = source_fn(SimpleNamespace(epoch_idx=0, iteration=1))
    assert [bytes(i) for i in images] == [ds[6].data, ds[7].data]
    assert [int(l) for l in labels] == [ds[6].label, ds[7].label] and [int(i) for i in indices] == [6, 7]
    assert [int(r) for r in replaced] == [-1, -1]
    table.stop(0)
    with pytest.raises(StopIteration):
        source_fn(SimpleNamespace(epoch_idx=0, iteration=2))


@pytest.fixture(scope="module")
def tiny_602(tmp_path_factory):
    """602 tiny JPEGs in many small shards: the case where DALI's own sharding gave two of four
    ranks a last batch of zero samples at batch 15."""
    import numpy as np
    from PIL import Image

    from converters import ConvertOptions, convert

    root = tmp_path_factory.mktemp("tiny602")
    rng = np.random.default_rng(0)
    for i in range(602):
        folder = root / "images" / f"c{i % 3}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (12, 16, 3), dtype=np.uint8)).save(folder / f"{i}.jpg")
    convert(root / "images", root / "tiny.wds", ConvertOptions(workers=2, progress=False, shard_bytes=64 << 10))
    return root / "tiny.wds"


@pytest.mark.parametrize("backend", BACKENDS)
def test_four_ranks_over_602_samples_at_batch_15_get_equal_non_empty_batches(tiny_602, backend):
    options = dict(batch_size=15, image_size=8, num_workers=1)
    ranks = [[idx.tolist() for _, _, idx in make_loader(tiny_602, backend=backend, rank=r, world_size=4, **options)]
             for r in range(4)]
    assert len({len(batches) for batches in ranks}) == 1 and all(b for batches in ranks for b in batches)
    assert sorted({i for batches in ranks for b in batches for i in b}) == list(range(602))


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_dali_serves_every_epoch_and_resume_from_one_pipeline(packed_wds, start_method):
    """The pipeline (and its source workers, which spawn starts anew each time) is built once: full
    epochs, an abandoned epoch, a repeated one and a resume all come from it, each exactly. The fork
    case is a CPU pipeline: DALI refuses to fork once CUDA is initialised in the process (on a GPU
    machine earlier tests have done that), so there it is skipped; DaliLoader picks spawn itself then."""
    from datapipe.backends.dali import cuda_initialized

    if start_method == "fork" and cuda_initialized():
        pytest.skip("DALI refuses to fork once CUDA is initialised in this process; the fork case runs on CPU machines")
    expected = {e: flat(epoch_indices(make_loader(packed_wds, backend="dataloader", **SMALL), e)) for e in (0, 1, 2)}
    device = "cpu" if start_method == "fork" else None
    loader = make_loader(packed_wds, backend="dali", start_method=start_method, device=device, **SMALL)
    assert flat(epoch_indices(loader, 0)) == expected[0]
    pipe = loader._pipe
    loader.set_epoch(1)
    next(iter(loader))  # abandoned after one batch
    assert flat(epoch_indices(loader, 2)) == expected[2]
    assert flat(epoch_indices(loader, 0)) == expected[0]
    state = {**loader.state_dict(), "epoch": 1, "samples_done": 10}
    loader.load_state_dict(state)
    loader.set_epoch(1)
    assert [i for _, _, idx in loader for i in idx.tolist()] == expected[1][10:]
    assert loader._pipe is pipe


def served(loader, epochs):
    """Per epoch: the record indices and a checksum of each image, from a loop that never calls set_epoch."""
    out = []
    for _ in range(epochs):
        batches = [(idx.tolist(), images.sum(dim=(1, 2, 3)).tolist()) for images, _, idx in loader]
        out.append(([i for idx, _ in batches for i in idx], [s for _, sums in batches for s in sums]))
    return out


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_loop_that_never_calls_set_epoch_gets_a_new_epoch_each_time(packed_wds, backend):
    """Lightning, Accelerate and old scripts only iterate: each pass is the next epoch (new order, new
    crops), batch for batch what set_epoch(e) before each pass serves."""
    size = len(open_dataset(packed_wds))
    plain = served(make_loader(packed_wds, backend=backend, **SMALL), 3)
    explicit = make_loader(packed_wds, backend=backend, **SMALL)
    for epoch, (order, _) in enumerate(plain):
        assert sorted(order) == list(range(size))
        assert order == flat(epoch_indices(explicit, epoch))
    assert plain[0][0] != plain[1][0] != plain[2][0]
    first, second = ({i: s for i, s in zip(*plain[e])} for e in (0, 1))
    assert sum(first[i] != second[i] for i in first) > size // 2  # new random crops and flips too


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_new_iteration_after_a_break_is_the_next_epoch_and_state_dict_says_where(packed_wds, backend):
    """As torch's DataLoader: iter() after a partial epoch starts the next epoch. state_dict() after
    an epoch's last batch names the next epoch's start, so a resume does not replay that epoch."""
    expected = {e: flat(epoch_indices(make_loader(packed_wds, backend=backend, **SMALL), e)) for e in (1, 2)}
    loader = make_loader(packed_wds, backend=backend, **SMALL)
    next(iter(loader))  # epoch 0, broken off after one batch
    assert loader.state_dict()["epoch"] == 0 and loader.state_dict()["batches_done"] == 1
    assert [i for _, _, idx in loader for i in idx.tolist()] == expected[1]
    state = loader.state_dict()
    assert (state["epoch"], state["samples_done"], state["batches_done"]) == (2, 0, 0)
    resumed = make_loader(packed_wds, backend=backend, **SMALL)
    resumed.load_state_dict(state)
    assert [i for _, _, idx in resumed for i in idx.tolist()] == expected[2]


def test_a_process_forked_beside_an_abandoned_dali_pipeline_does_not_hang(packed_wds):
    """A DALI loader left in a reference cycle, then a fork (a DataLoader worker of another loader):
    the child's garbage collector reaches the pipeline copy. It must not wait for DALI's threads,
    which the child does not have (it hung forever before)."""
    import gc
    import os
    import signal

    loader = make_loader(packed_wds, backend="dali", **SMALL)
    next(iter(loader))
    loader.cycle = loader  # only the garbage collector frees it
    gc.disable()  # keep the cycle for the child to collect
    try:
        del loader
        pid = os.fork()
        if pid == 0:  # the child: collect, then leave as forked workers do
            signal.alarm(20)  # a hung child is killed by SIGALRM and reported below
            gc.collect()
            os._exit(0)
        _, status = os.waitpid(pid, 0)
    finally:
        gc.enable()
        gc.collect()
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"the forked child did not exit cleanly (wait status {status})"
