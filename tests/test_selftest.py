"""`datapipe doctor --gpu` on a machine without a GPU: the one-line answer, and every part of the
self-test that runs on a CPU (verdicts and their tolerances, table, JSON, exit status, the checks'
CPU halves over real loaders, AMP steps, a gloo all-reduce through the same harness). The GPU halves
run in tests/backends/test_gpu.py."""
import json
import subprocess
import sys

import pytest
import torch

from datapipe.doctor.selftest import document, exit_status, gpu_absent, table
from datapipe.doctor.selftest.compare import (DECODE_TOLERANCE, bandwidth_result, compare_exact, compare_sums,
                                       compare_views, overlap_result, overlaps, view_difference)
from datapipe.doctor.selftest.probe import Probe, collect_views
from datapipe.doctor.selftest.report import Result, failed

no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the answer where no GPU is present")
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    from datapipe.doctor.selftest.sample import synthetic_folder

    return synthetic_folder(tmp_path_factory.mktemp("selftest") / "images", images=24)


@pytest.fixture(scope="module")
def probe(synthetic):
    return Probe(synthetic, batches=3, batch_size=8, workers=1)


@no_gpu
@pytest.mark.parametrize("json_flag", [[], ["--json"]])
def test_without_a_gpu_it_says_so_in_one_line_and_exits_0(json_flag):
    done = subprocess.run([sys.executable, "-m", "datapipe", "doctor", "--gpu", *json_flag], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1 and "no CUDA GPU visible" in lines[0]
    if json_flag:
        assert json.loads(lines[0])["exit_status"] == 0
    assert gpu_absent() is not None and "CPU build" in gpu_absent()


def test_the_synthetic_sample_holds_the_jpeg_kinds_the_gpu_decoders_treat_apart(synthetic):
    from PIL import Image

    files = sorted(synthetic.rglob("*.jpg"))
    assert len(files) == 24 and len({f.parent.name for f in files}) == 3
    opened = [Image.open(f) for f in files]
    assert any(im.info.get("progressive") for im in opened) and any(im.mode == "L" for im in opened)
    assert len({im.size for im in opened}) > 10
    from datapipe.doctor.selftest.sample import synthetic_folder

    with pytest.raises(ValueError, match="images must be at least 3"):
        synthetic_folder(synthetic.parent / "few", images=2)


def test_the_decode_check_passes_dali_cpu_views_and_catches_a_mirrored_one(probe):
    """The check's CPU half over real loaders: DALI's CPU graph against the dataloader backend on the
    synthetic sample passes the stated tolerance; the same views mirrored fail it (the control)."""
    from datapipe.doctor.selftest.decode import dali_versus_cpu

    result = dali_versus_cpu(probe, CPU, hw_decoder_load=0.65)
    assert result.status == "pass", result
    assert result.values["records"] == 24 and result.values["worst"] < DECODE_TOLERANCE
    cpu = collect_views(probe.loader("dataloader", "cpu"), probe.batches)
    mirrored = {i: (image.flip(-1), label) for i, (image, label) in cpu.items()}
    bad = compare_views("dali_decode", mirrored, cpu)
    assert bad.status == "fail" and bad.values["over_tolerance"] and "beyond the tolerance" in bad.detail


def test_view_comparisons_fail_on_missing_records_and_wrong_labels():
    image = torch.zeros(3, 8, 8)
    assert compare_views("c", {0: (image, 1)}, {0: (image, 1), 1: (image, 0)}).status == "fail"
    wrong = compare_views("c", {0: (image, 2)}, {0: (image, 1)})
    assert wrong.status == "fail" and "labels differ" in wrong.figure
    assert compare_views("c", {}, {}).status == "fail"
    one_level = 1 / (torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1) * 255)  # in normalized units
    assert view_difference(image, image + one_level) == pytest.approx(1.0)


def test_the_prefetch_check_on_cpu_matches_the_dataloader_backend_exactly(probe):
    from datapipe.doctor.selftest.transfer import prefetch_matches_dataloader

    assert prefetch_matches_dataloader(probe, CPU).status == "pass"
    image = torch.zeros(3, 4, 4)
    off = compare_exact("p", {0: (image + 1e-7, 0)}, {0: (image, 0)})
    assert off.status == "fail" and off.values["unequal"] == [0]


def test_checksums_of_batches_read_late_must_equal_those_read_at_once():
    assert compare_sums("h", [1.0, 2.0], [1.0, 2.0]).status == "pass"
    changed = compare_sums("h", [1.0, 2.5], [1.0, 2.0])
    assert changed.status == "fail" and changed.values["changed"] == [1]
    assert compare_sums("h", [1.0], [1.0, 2.0]).status == "fail"


def test_overlap_of_copies_and_steps():
    steps = [(0.0, 40.0), (40.0, 80.0), (80.0, 120.0)]
    assert overlaps([(10.0, 10.1), (45.0, 45.2), (130.0, 131.0)], steps) == 2
    first_left_out = [(-1.0, -0.9)]  # the first copy precedes every step
    assert overlap_result("o", first_left_out + [(1.0, 1.1), (41.0, 41.1)], steps).status == "pass"
    assert overlap_result("o", first_left_out + [(1.0, 1.1), (200.0, 200.1), (300.0, 300.1)], steps).status == "warn"
    none = overlap_result("o", first_left_out + [(40.0, 40.0), (121.0, 122.0)], steps)
    assert none.status == "fail" and none.values["overlapped"] == 0  # touching is not overlapping
    assert overlap_result("o", first_left_out, steps).status == "skip"


def test_bandwidth_verdicts():
    ok = bandwidth_result("b", 24.0, 10.0, intact=True)
    assert ok.status == "pass" and "2.4x" in ok.figure and ok.values["ratio"] == 2.4
    assert bandwidth_result("b", 9.0, 10.0, intact=True).status == "warn"
    assert bandwidth_result("b", 24.0, 10.0, intact=False).status == "fail"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_an_amp_step_is_finite_updates_the_weights_and_the_scaler_skips_inf(dtype):
    """The same function the GPU runs, on CPU (autocast and GradScaler("cpu") exist there)."""
    from datapipe.doctor.selftest.amp import amp_step

    result = amp_step(CPU, dtype)
    assert result.status == "pass", result
    assert result.values["autocast_dtype"] == str(dtype).replace("torch.", "")
    if dtype == torch.float16:
        assert result.values["scale_after_inf"] == result.values["scale"] / 2


def test_the_all_reduce_harness_with_gloo_on_cpu():
    """Two spawned ranks through the NCCL check's harness, with gloo: the sums and the figure."""
    from datapipe.doctor.selftest.collective import all_reduce_check, all_reduce_result

    result = all_reduce_check(2, backend="gloo", nbytes=1 << 20, timeout=120)
    assert result.status == "pass", result
    assert result.values["ranks"] == 2 and result.values["busbw_gb_s"] > 0
    assert all_reduce_check(1).status == "skip"
    broken = all_reduce_result("a", [{"correct": True, "seconds": 1.0}, {"error": "RuntimeError: nope"}], nbytes=4)
    assert broken.status == "fail" and "rank 1: RuntimeError: nope" in broken.detail
    wrong = all_reduce_result("a", [{"correct": True, "seconds": 1.0}, {"correct": False, "seconds": 1.0}], nbytes=4)
    assert wrong.status == "fail" and "ranks [1]" in wrong.detail


def test_the_hardware_decoder_row_names_the_missing_video_capability():
    from datapipe.doctor.selftest.decode import hardware_decoder_result, hardware_decoder_status, video_capability

    assert video_capability({}) is None
    assert video_capability({"NVIDIA_DRIVER_CAPABILITIES": "compute,utility"}) is False
    assert video_capability({"NVIDIA_DRIVER_CAPABILITIES": "compute, video"}) is True
    assert video_capability({"NVIDIA_DRIVER_CAPABILITIES": "all"}) is True
    assert hardware_decoder_result(True, "probe", None).status == "pass"
    hidden = hardware_decoder_result(False, "probe", False)
    assert hidden.status == "warn" and "capabilities=compute,utility,video" in hidden.detail
    assert hardware_decoder_result(False, "probe", True).status == "info"
    available, how = hardware_decoder_status()  # libnvjpeg loads here (the DALI wheels), and no GPU answers
    assert available is not True or torch.cuda.is_available()
    assert "nvjpeg" in how.lower()


def test_table_json_and_exit_status_from_injected_results():
    results = [Result("gpu", "info", "H100"), Result("dali_decode_hw0.65", "pass", "48 records, worst 1.10 levels"),
               Result("prefetch_overlap", "warn", "2 of 5", "host too slow"), Result("amp_bf16", "skip", "n/a")]
    assert exit_status(results) == 0
    text = table(results, "title")
    assert text.splitlines()[0] == "title" and "WARN  prefetch_overlap" in text and "-> host too slow" in text
    assert text.splitlines()[-1] == "1 passed, 0 failed, 3 other"
    results.append(failed("amp_fp16", RuntimeError("CUDA error: an illegal memory access\nwas encountered")))
    assert exit_status(results) == 1 and results[-1].detail == "RuntimeError: was encountered"
    doc = json.loads(json.dumps(document(results, {"gpu": None})))
    assert doc["exit_status"] == 1 and [r["status"] for r in doc["results"]][-1] == "fail"
    with pytest.raises(ValueError, match="status must be one of"):
        Result("x", "ok")


def test_doctor_checks_the_video_capability_and_dev_shm():
    from datapipe.doctor.pipeline import shm_check, video_capability_check

    assert video_capability_check({}, nvcuvid=True).status == "ok"
    lacking = video_capability_check({"NVIDIA_DRIVER_CAPABILITIES": "compute,utility"}, nvcuvid=False)
    assert lacking.status == "warn" and "NVIDIA_DRIVER_CAPABILITIES=compute,utility,video" in lacking.hint
    assert video_capability_check({"NVIDIA_DRIVER_CAPABILITIES": "all"}, nvcuvid=False).status == "warn"
    docker_default = shm_check(64 << 20, gpus=1, workers=8)
    assert docker_default.status == "warn" and "--shm-size" in docker_default.hint
    assert shm_check(64 << 30, gpus=8, workers=12).status == "ok"
    assert shm_check(7 << 30, gpus=8, workers=1).status == "warn"  # under 1 GiB per GPU
    assert shm_check(None, gpus=0, workers=2).status == "info"


def test_doctor_names_the_cuda_11_dali_build_instead_of_calling_torch_a_cpu_build():
    from datapipe.backends.dali import pip_hint
    from datapipe.doctor.pipeline import dali_build_check

    check = dali_build_check(["nvidia-dali-cuda120"], "11.8")
    assert check.status == "warn" and "CPU build" not in check.value and "nvidia-dali-cuda110" in check.hint
    assert dali_build_check(["nvidia-dali-cuda110"], "11.8").status == "ok"
    assert dali_build_check([], None).status == "info" and "CPU build" in dali_build_check([], None).value
    assert "nvidia-dali-cuda110" in pip_hint("11.8") and "cu12" not in pip_hint("11.8")
    assert "datapipe[dali-cu13]" in pip_hint("13.0") and "CPU build" in pip_hint("")


def test_the_recipe_ops_case_runs_on_dalis_cpu_operators_one_passing_row_per_kind():
    """The doctor's recipe case as `doctor --gpu` runs it (its entry in the check list), on DALI's
    CPU operators: one row per kind of the op table and "chain", each within its tolerance."""
    pytest.importorskip("nvidia.dali")
    from datapipe.augment.ops import KINDS
    from datapipe.doctor.selftest import _checks
    from datapipe.doctor.selftest.recipe_ops import KIND_TOLERANCE

    results = dict(_checks(None, CPU, {}))["recipe_ops"]()
    assert [r.check for r in results] == [f"recipe_op_{kind}" for kind in (*KINDS[1:], "chain")]
    assert all(r.status == "pass" for r in results) and exit_status(results) == 0, table(results)
    doc = json.loads(json.dumps(document(results, {"gpu": None})))
    rotate = next(r for r in doc["results"] if r["check"] == "recipe_op_rotate")["values"]
    assert rotate["tolerance"] == list(KIND_TOLERANCE["rotate"]) and rotate["applier"] == "DALI's CPU operators"
    assert rotate["mean"] <= KIND_TOLERANCE["rotate"][0] and rotate["change"] > 1


def test_the_recipe_ops_case_fails_a_wrong_dali_kernel_naming_its_kind(monkeypatch):
    """Control: solarize's DALI kernel swapped for invert's (a kernel linked to the wrong kind) fails
    solarize's row and the chains that hold solarize, and no other."""
    pytest.importorskip("nvidia.dali")
    from dataclasses import replace

    from datapipe.augment import ops
    from datapipe.doctor.selftest.recipe_ops import recipe_op_results, synthetic_images

    monkeypatch.setitem(ops.TABLE, "solarize", replace(ops.TABLE["solarize"], dali=ops.TABLE["invert"].dali))
    results = recipe_op_results(CPU, synthetic_images(photos=1))
    failing = {r.check: r for r in results if r.status == "fail"}
    assert set(failing) == {"recipe_op_solarize", "recipe_op_chain"} and exit_status(results) == 1, table(results)
    assert failing["recipe_op_solarize"].detail.startswith("solarize: DALI's CPU operators differ from the CPU applier")
    assert "levels (tolerance 0)" in failing["recipe_op_solarize"].detail
