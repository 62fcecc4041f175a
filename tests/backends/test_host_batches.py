"""Host batch memory: written again only once nothing holds the batch (the pool), in every backend
that normalizes on a CPU device, and the compiled normalize table refusing what does not fit."""
import gc

import numpy as np
import pytest
import torch

from datapipe import make_loader
from datapipe.backends.host_batches import BatchPool
from tests.processes import deadline

TINY = dict(batch_size=4, image_size=32, num_workers=2)

SHAPE = torch.Size((4, 3, 8, 8))


def take(pool, shape=SHAPE, dtype=torch.float32, channels_last=False):
    return pool.empty(shape, dtype, channels_last)


@pytest.mark.parametrize("hold", ["batch", "row", "numpy", "flat", "list"])
def test_a_batch_held_in_any_form_is_never_handed_out_again(hold):
    pool = BatchPool(keep=4)
    batch = take(pool)
    address = batch.data_ptr()
    held = {"batch": lambda b: b, "row": lambda b: b[2], "numpy": lambda b: b.numpy(),
            "flat": lambda b: b.view(-1)[5:], "list": lambda b: [b]}[hold](batch)
    del batch
    gc.collect()
    for _ in range(3):
        assert take(pool).data_ptr() != address
    assert pool.reused == 2 and pool.allocated == 2  # the second batch's memory, let go of each time
    del held
    assert take(pool).data_ptr() == address  # let go of: its memory serves the next batch


def test_memory_let_go_of_serves_the_next_batch_of_any_dtype_and_layout_that_fits():
    pool = BatchPool(keep=4)
    address = take(pool).data_ptr()  # dropped at once
    half = take(pool, dtype=torch.bfloat16, channels_last=True)
    assert half.data_ptr() == address and half.dtype == torch.bfloat16
    assert half.is_contiguous(memory_format=torch.channels_last)
    bigger = take(pool, shape=torch.Size((8, 3, 8, 8)))
    assert bigger.data_ptr() != address and pool.allocated == 2  # half still holds the first


def test_the_pool_keeps_at_most_keep_arrays_and_clear_lets_them_go():
    pool = BatchPool(keep=2)
    held = [take(pool) for _ in range(3)]  # all held: three allocations, the oldest dropped from the pool
    assert pool.allocated == 3 and len(pool._arrays) == 2
    first = held[0].data_ptr()
    held.clear()
    assert take(pool).data_ptr() != first  # the pool no longer had it
    pool.clear()
    assert pool._arrays == []


@pytest.mark.parametrize("backend", ["threads", "dataloader", "prefetch"])
def test_held_batches_keep_their_values_while_batches_let_go_of_are_written_again(packed_lmdb, backend):
    """The caller holds every third batch to the end and lets go of the others at once: each batch
    arrives with the values of a run that held them all (reused memory is fully rewritten), the held
    ones still have them at the end (never written again), and memory was reused."""
    with deadline(60):
        expected = {i: img for images, _, idx in list(make_loader(packed_lmdb, backend=backend, **TINY))
                    for i, img in zip(idx.tolist(), images)}
    loader = make_loader(packed_lmdb, backend=backend, **TINY)
    held = []
    with deadline(60):
        for k, (images, _, idx) in enumerate(loader):
            assert all(torch.equal(img, expected[i]) for i, img in zip(idx.tolist(), images)), f"batch {k}"
            if k % 3 == 0:
                held.append((idx, images))
    assert loader.normalize.pool.reused > 0
    assert all(torch.equal(img, expected[i]) for idx, images in held for i, img in zip(idx.tolist(), images))
    assert loader.normalize.pool._arrays == []  # let go of at the end of the iteration


normalize = pytest.importorskip("datapipe._normalize", reason="the optional compiled normalize is not built")


@pytest.mark.parametrize("image,row,table,message", [
    (3 * 16, 3 * 16 * 4, 768 * 3, "table must hold 3 x 256 items"),
    (3 * 16, 3 * 16 * 4, 768 * 8, "table must hold 3 x 256 items"),
    (16, 16 * 4, 768 * 4, "3 planes"),
    (3 * 16, 3 * 16 * 2, 768 * 4, "row must hold 192 bytes"),
])
def test_the_compiled_normalize_refuses_sizes_that_do_not_fit(image, row, table, message):
    with pytest.raises(ValueError, match=message):
        normalize.normalize_into(np.zeros(image, np.uint8), np.zeros(row, np.uint8), bytes(table), False)


def test_the_compiled_normalize_refuses_a_read_only_row():
    with pytest.raises(TypeError):
        normalize.normalize_into(np.zeros(48, np.uint8), bytes(192), bytes(768 * 4), False)


@pytest.mark.parametrize("itemsize", [2, 4])
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("side,offset", [(224, 0), (7, 0), (224, 1), (33, 3)])
def test_the_compiled_normalize_maps_every_pixel_through_its_channels_table(itemsize, channels_last, side, offset):
    """Item for item what indexing the table gives, in both layouts and item sizes, for rows on a
    16-byte boundary (whole blocks streamed) and off it, and sizes that leave a tail."""
    rng = np.random.default_rng(side + offset)
    dtype = {2: np.uint16, 4: np.uint32}[itemsize]
    table = rng.integers(0, np.iinfo(dtype).max, (3, 256), dtype=dtype)
    image = rng.integers(0, 256, (3, side, side), dtype=np.uint8)
    memory = np.zeros(3 * side * side + offset + 16, dtype)
    row = memory[offset:offset + 3 * side * side]
    normalize.normalize_into(image, row.view(np.uint8), table.tobytes(), channels_last)
    expected = np.stack([table[c][image[c]] for c in range(3)])  # CHW
    assert np.array_equal(row, (expected.transpose(1, 2, 0) if channels_last else expected).reshape(-1))
    assert not memory[offset + 3 * side * side:].any() and not memory[:offset].any()  # nothing written beside
