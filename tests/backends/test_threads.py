"""The thread backend: the dataloader backend's batches exactly, its buffers never reused early, no
decode thread left behind, and an error in a thread raised in the consumer, naming the record."""
import gc
import logging
import subprocess
import sys
import threading
import time

import pytest
import torch

from datapipe import make_loader
from datapipe.backends import normalize as normalize_module
from datapipe.backends.threads import THREAD_PREFIX
from datapipe.formats.lmdb import LmdbDataset
from datapipe.storage import StoreError
from tests.processes import deadline

TINY = dict(batch_size=4, image_size=32, num_workers=2)
BAD = 5


def decode_threads():
    return [t.name for t in threading.enumerate() if t.name.startswith(THREAD_PREFIX)]


class SlowNormalizer:
    """The loader's normalizer, which first waits a little: a buffer refilled before its read is done
    would be overwritten by the decode threads meanwhile."""

    def __init__(self, normalize):
        self.normalize = normalize

    def batch(self, *host):
        time.sleep(0.02)
        return self.normalize.batch(*host)

    def __getattr__(self, name):  # empty, sample_into: the fused path's
        return getattr(self.normalize, name)


def kept_batches(loader, epoch):
    """Every batch of an epoch, all kept until the end: (indices in order, {index: image})."""
    loader.set_epoch(epoch)
    with deadline(60):
        batches = list(loader)
    return [i for _, _, idx in batches for i in idx.tolist()], {
        i: img for images, _, idx in batches for i, img in zip(idx.tolist(), images)}


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "ring"])
@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("prefetch_factor", [1, 3])
def test_batches_equal_the_dataloader_backends_in_order_and_pixel_for_pixel(packed_lmdb, train, prefetch_factor, fused):
    """The same records, order and views (the same plans), every batch kept to the end: a buffer
    refilled while it is read or handed out, a batch served out of order, a view drawn another way
    or a sample normalized otherwise would show here. Both ways of filling a batch: fused (what a
    CPU device gets) and the uint8 ring (what CUDA gets), run here on the CPU."""
    options = dict(TINY, train=train, prefetch_factor=prefetch_factor)
    threads = make_loader(packed_lmdb, backend="threads", rank=1, world_size=2, **options)
    threads.normalize = SlowNormalizer(threads.normalize)
    threads.fused = fused
    processes = make_loader(packed_lmdb, backend="dataloader", rank=1, world_size=2, **{**options, "num_workers": 1})
    for epoch in (0, 1):
        order, images = kept_batches(threads, epoch)
        expected_order, expected = kept_batches(processes, epoch)
        assert order == expected_order
        assert all(torch.equal(images[i], expected[i]) for i in order), f"epoch {epoch}: a view differs"


def test_workers_0_decodes_in_the_caller(packed_lmdb):
    loader = make_loader(packed_lmdb, backend="threads", **{**TINY, "num_workers": 0})
    order, _ = kept_batches(loader, 0)
    assert sorted(order) == list(range(len(loader.dataset))) and not decode_threads()


def test_an_abandoned_iteration_leaves_no_decode_thread(packed_lmdb):
    loader = make_loader(packed_lmdb, backend="threads", **TINY)
    with deadline(60):
        for _ in loader:
            assert len(decode_threads()) == 2
            break
        assert not decode_threads()
        batches = iter(loader)
        next(batches)
        del batches  # dropped mid-epoch, without a close()
        assert not decode_threads()
        batches = iter(loader)
        next(batches)
        cycle = [batches]
        cycle.append(cycle)  # only the garbage collector frees it
        del batches, cycle, loader
        gc.collect()
    assert not decode_threads()


EXIT_WITH_AN_OPEN_ITERATOR = """
import sys
from datapipe import make_loader
loader = make_loader(sys.argv[1], backend="threads", batch_size=8, image_size=320, num_workers=2, prefetch_factor=4)
batches = iter(loader)  # kept in a global: still open when the interpreter exits
next(batches)
"""


def test_the_interpreter_exits_cleanly_with_an_iteration_still_open(packed_lmdb):
    """A script that keeps an iterator in a global and ends while its decode threads are busy: the
    threads are stopped before Python finalizes. Before, a thread still inside torch's resize then
    aborted the process (status 134, "terminate called without an active exception") in most runs."""
    for _ in range(3):
        done = subprocess.run([sys.executable, "-c", EXIT_WITH_AN_OPEN_ITERATOR, str(packed_lmdb)],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and "terminate called" not in done.stderr, done.stderr[-2000:]


@pytest.mark.parametrize("on_error, error, match", [
    ("raise", KeyError("no such key"), rf"cannot read or decode record {BAD} \(record {BAD}\): KeyError"),
    ("skip", StoreError("the store went away"), "the store went away"),  # a store error is never substituted
])
def test_an_error_in_a_decode_thread_reaches_the_consumer_naming_the_record(packed_lmdb, monkeypatch, on_error,
                                                                              error, match):
    read = LmdbDataset.record

    def failing(self, index):
        if index == BAD:
            raise error
        return read(self, index)

    monkeypatch.setattr(LmdbDataset, "record", failing)
    loader = make_loader(packed_lmdb, backend="threads", train=False, on_error=on_error, **TINY)
    with deadline(60), pytest.raises(type(error) if on_error == "skip" else RuntimeError, match=match) as caught:
        list(loader)
    assert any(f"serving record {BAD}" in note and THREAD_PREFIX in note for note in caught.value.__notes__)
    assert not decode_threads()


def test_auto_picks_threads_for_a_local_dataset_and_processes_for_a_remote_one_saying_why():
    from datapipe.backends import choose_backend

    name, reason = choose_backend("auto", torch.device("cpu"), remote=True)
    assert name == "dataloader" and "object store" in reason
    name, reason = choose_backend("auto", torch.device("cpu"))
    assert name == "threads" and "docs/loaders.md" in reason


def test_the_backends_reason_is_logged_whole_once_a_process(packed_lmdb, caplog):
    """A run's train and val loaders printed the same banner, reason and all, twice (#48 row 13)."""
    from datapipe import backends, make_loader

    backends._announced.clear()
    with caplog.at_level(logging.INFO, logger="datapipe"):
        for split in ("train", "val"):
            make_loader(packed_lmdb, split=split, batch_size=2, image_size=16, backend="threads", num_workers=0)
    banners = [r.getMessage() for r in caplog.records if "backend (" in r.getMessage()]
    assert len(banners) == 2 and "(requested)" in banners[0] and "(requested)" in banners[1]
    backends._announced.clear()
    with caplog.at_level(logging.INFO, logger="datapipe"):
        caplog.clear()
        for split in ("train", "val"):
            make_loader(packed_lmdb, split=split, batch_size=2, image_size=16, num_workers=0)
    first, second = [r.getMessage() for r in caplog.records if "backend (" in r.getMessage()]
    assert "preallocated batch buffers" in first and "threads backend (no CUDA, local dataset) over" in second


@pytest.mark.parametrize("path", ["table", "torch"])
@pytest.mark.parametrize("dtype,channels_last", [(torch.float32, False), (torch.float32, True), (torch.bfloat16, False),
                                                 (torch.float16, True)])
def test_fused_normalize_gives_the_dataloader_backends_values_in_every_dtype_and_layout(packed_lmdb, dtype, channels_last,
                                                                                        path, monkeypatch):
    """Each decode thread normalizes its own sample on a CPU device: the same values, dtype and memory
    format as the dataloader backend's whole-batch normalize, by the compiled table and by torch's
    operations (what a build without the optional extension uses)."""
    if path == "table":
        pytest.importorskip("datapipe._normalize", reason="the optional compiled normalize is not built")
    else:
        monkeypatch.setattr(normalize_module, "_normalize", None)
    options = dict(TINY, dtype=dtype, channels_last=channels_last)
    threads = make_loader(packed_lmdb, backend="threads", **options)
    assert threads.fused
    order, images = kept_batches(threads, 0)
    expected_order, expected = kept_batches(make_loader(packed_lmdb, backend="dataloader", **options), 0)
    assert order == expected_order
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    for i in order:
        assert images[i].dtype == dtype and images[i][None].is_contiguous(memory_format=memory_format)
        assert torch.equal(images[i], expected[i]), f"record {i} normalized otherwise"
