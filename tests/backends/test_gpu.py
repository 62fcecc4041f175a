"""GPU paths: CUDA-stream prefetch, DALI mixed (nvJPEG) decode, pinned H2D. They run wherever a CUDA
GPU is present and skip only where none is (CI has none; see the README for where they were run)."""
import pytest
import torch

from datapipe import make_loader
from tests.backends.test_views import pixel_diff

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU; none is present")]
SMALL = dict(batch_size=5, image_size=64, num_workers=2, train=False)


def by_index(loader):
    return {i: (img, lab) for images, labels, indices in loader
            for i, img, lab in zip(indices.tolist(), images, labels)}


def test_prefetch_on_cuda_matches_the_dataloader_backend_exactly(packed_lmdb):
    plain = by_index(make_loader(packed_lmdb, backend="dataloader", **SMALL))
    images, labels, _ = next(iter(make_loader(packed_lmdb, backend="prefetch", **SMALL)))
    assert images.is_cuda and labels.is_cuda
    streamed = by_index(make_loader(packed_lmdb, backend="prefetch", **SMALL))
    assert streamed.keys() == plain.keys()
    for i, (img, lab) in streamed.items():
        assert torch.equal(img, plain[i][0]) and lab == plain[i][1]


def test_prefetched_batches_survive_allocator_reuse(packed_lmdb):
    """record_stream: the step drops its reference to a batch while its kernels still read it (a
    long GPU sleep queued first); without record_stream the allocator hands that memory to the next
    batch's copy on the side stream, which overwrites it before the checksum reads it. The
    checksums, taken late on the current stream, must equal those of the same batches read plainly."""
    options = dict(batch_size=4, image_size=64, num_workers=2, train=False)
    expected = [images.double().sum().item() for images, _, _ in make_loader(packed_lmdb, backend="dataloader", **options)]
    sums = []
    for images, _, _ in make_loader(packed_lmdb, backend="prefetch", **options):
        torch.cuda._sleep(50_000_000)  # ~30 ms of GPU time ahead of the read below, on the current stream
        sums.append(images.double().sum())
        del images  # the loader's next copy may now reuse this block unless record_stream protects it
    torch.cuda.synchronize()
    assert [s.item() for s in sums] == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("source", ["packed_lmdb", "packed_wds", "clean_folder"])
def test_dali_mixed_decode_covers_every_record_and_matches_the_cpu_view(request, source):
    path = request.getfixturevalue(source)
    loader = make_loader(path, backend="dali", **SMALL)
    gpu = by_index(loader)
    cpu = by_index(make_loader(path, backend="dataloader", device="cpu", **SMALL))
    assert gpu.keys() == cpu.keys()
    for i, (img, lab) in gpu.items():
        assert img.is_cuda and int(lab) == int(cpu[i][1])
        assert pixel_diff(img.float().cpu(), cpu[i][0]) < 3, f"record {i}"


def test_bench_measures_pinned_and_pageable_copies(packed_lmdb):
    from datapipe.bench import BenchOptions, run_bench

    rows = run_bench([packed_lmdb], BenchOptions(seconds=0.5, repeats=1, batch_size=8, image_size=64), suites=("h2d",))
    assert {r.backend for r in rows} == {"pinned", "pageable"} and all(r.mb_per_s > 0 for r in rows)
