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


@pytest.mark.parametrize("backend", ["prefetch", "ray"])  # ray: received batches pinned, up on a side stream
def test_prefetch_on_cuda_matches_the_dataloader_backend_exactly(packed_lmdb, backend):
    plain = by_index(make_loader(packed_lmdb, backend="dataloader", **SMALL))
    images, labels, _ = next(iter(make_loader(packed_lmdb, backend=backend, **SMALL)))
    assert images.is_cuda and labels.is_cuda
    streamed = by_index(make_loader(packed_lmdb, backend=backend, **SMALL))
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


@pytest.mark.parametrize("hw_decoder_load", [0.65, 0.0])
def test_dali_batches_survive_allocator_reuse(packed_lmdb, hw_decoder_load):
    """As the prefetcher's test above, for DALI: each batch's checksum is queued behind ~30 ms of GPU
    work and its last reference dropped at once, while DALI decodes the next batches. Were a batch
    still DALI's memory (its iterator hands out DLPack views of its own buffers), DALI could reuse it
    meanwhile, and nvJPEG's hardware decoder (hw_decoder_load > 0) writes at call time, ignoring
    stream order (torchcodec #1634, vision #9606). The loader copies each batch into torch's memory
    and holds DALI's buffers until that copy ran (backends/dali/handoff.py)."""
    options = dict(batch_size=4, image_size=64, num_workers=2, train=False)
    loader = make_loader(packed_lmdb, backend="dali", **options)
    loader.hw_decoder_load = hw_decoder_load
    loader.set_epoch(0)
    expected = [images.double().sum().item() for images, _, _ in loader]
    loader.set_epoch(0)
    sums = []
    for images, labels, _ in loader:
        assert labels.is_cuda and labels.dtype == torch.int64  # labels.gpu() in the graph
        torch.cuda._sleep(50_000_000)
        sums.append(images.double().sum())
        del images
    torch.cuda.synchronize()
    assert [s.item() for s in sums] == pytest.approx(expected, rel=1e-6)
    assert len(loader._handoff) <= 8  # DALI's buffers are let go once their copies ran


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    from datapipe.doctor.selftest.probe import Probe
    from datapipe.doctor.selftest.sample import synthetic_folder

    return Probe(synthetic_folder(tmp_path_factory.mktemp("selftest") / "images"))


@pytest.mark.parametrize("hw_decoder_load", [0.65, 0.0])
def test_selftest_dali_mixed_decode_matches_the_cpu_decode(probe, hw_decoder_load):
    from datapipe.doctor.selftest.decode import dali_handoff, dali_versus_cpu

    device = torch.device("cuda", torch.cuda.current_device())
    result = dali_versus_cpu(probe, device, hw_decoder_load=hw_decoder_load)
    assert result.status == "pass", result
    handoff = dali_handoff(probe, device, hw_decoder_load=hw_decoder_load)
    assert handoff.status == "pass", handoff


def test_selftest_prefetcher_copy_amp_and_hardware_decoder_rows(probe):
    from datapipe.doctor.selftest.amp import amp_step
    from datapipe.doctor.selftest.decode import hardware_decoder_status
    from datapipe.doctor.selftest.transfer import h2d_bandwidth, prefetch_matches_dataloader, prefetch_overlap

    device = torch.device("cuda", torch.cuda.current_device())
    assert prefetch_matches_dataloader(probe, device).status == "pass"
    overlap = prefetch_overlap(probe, device)
    assert overlap.status in ("pass", "warn"), overlap
    assert h2d_bandwidth(device).status in ("pass", "warn")
    assert amp_step(device, torch.float16).status == "pass"
    if torch.cuda.is_bf16_supported():
        assert amp_step(device, torch.bfloat16).status == "pass"
    available, how = hardware_decoder_status()
    assert available is not None, how


def test_selftest_recipe_ops_on_dalis_gpu_operators_match_the_cpu_applier():
    """Each op kind on DALI's GPU operators (the images on the GPU before the ops, as the dali
    backend's graph) against augment.cpu, within the tolerances measured on DALI's CPU operators."""
    pytest.importorskip("nvidia.dali")
    from datapipe.doctor.selftest.recipe_ops import recipe_op_results

    results = recipe_op_results(torch.device("cuda", torch.cuda.current_device()))
    failed = [r for r in results if r.status != "pass"]
    assert len(results) > 10 and not failed, failed


def test_doctor_gpu_end_to_end_json(tmp_path):
    """The one command a first GPU session runs: every row, none failed, exit status 0."""
    import json
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "datapipe", "doctor", "--gpu", "--json"], capture_output=True,
                          text=True, timeout=900)
    doc = json.loads(done.stdout)
    failed = [r for r in doc["results"] if r["status"] == "fail"]
    assert done.returncode == doc["exit_status"] == 0 and not failed, failed
    assert {r["check"] for r in doc["results"]} >= {"gpu", "nvjpeg_hardware", "prefetch_batches", "prefetch_overlap",
                                                    "h2d_bandwidth", "amp_fp16", "nccl_all_reduce"}


two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")


@two_gpus
def test_nccl_all_reduce_over_two_gpus():
    from datapipe.doctor.selftest.collective import all_reduce_check

    result = all_reduce_check(2, backend="nccl")
    assert result.status == "pass", result


@two_gpus
def test_two_rank_nccl_dali_training_through_torchrun_ends_with_identical_weights(packed_wds, tmp_path):
    import json
    import subprocess
    import sys
    from pathlib import Path

    from tests.train.support import free_port

    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(free_port()), "-m", "datapipe", "train", str(packed_wds), "--model", "resnet18",
           "--epochs", "1", "--batch-size", "8", "--image-size", "64", "--workers", "2", "--backend", "dali",
           "--out", str(tmp_path)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr[-3000:]
    assert "communicate through gloo" not in done.stderr  # one GPU per rank: NCCL
    digests = json.loads((tmp_path / "summary.json").read_text())["weights_digest_per_rank"]
    assert len(digests) == 2 and digests[0] == digests[1]
