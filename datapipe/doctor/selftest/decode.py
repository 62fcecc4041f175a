"""GPU decode checks: DALI's mixed (nvJPEG) decode against the CPU decode of the same records, its
batches against reuse of their memory, and whether nvJPEG's hardware decoder is there to use."""
from __future__ import annotations

import ctypes
import glob
import importlib.util
import itertools
from collections.abc import Mapping

import torch

from .compare import DECODE_TOLERANCE, compare_sums, compare_views
from .probe import GpuLoad, Probe, collect_views
from .report import Result

NVJPEG_BACKEND_HARDWARE = 3  # nvjpeg.h: nvjpegBackend_t
NVJPEG_STATUS_ARCH_MISMATCH = 7
HOLD_MS = 30.0  # GPU work queued ahead of each late checksum: later batches decode meanwhile


def dali_versus_cpu(probe: Probe, device: torch.device, *, hw_decoder_load: float) -> Result:
    """DALI's eval views on the GPU against the dataloader backend's CPU (Pillow) views."""
    check = f"dali_decode_hw{hw_decoder_load:g}"
    cpu = collect_views(probe.loader("dataloader", "cpu"), probe.batches)
    loader = probe.loader("dali", device)
    loader.hw_decoder_load = hw_decoder_load
    result = compare_views(check, collect_views(loader, probe.batches), cpu, tolerance=DECODE_TOLERANCE)
    result.values["hw_decoder_load"] = hw_decoder_load
    return result


def dali_handoff(probe: Probe, device: torch.device, *, hw_decoder_load: float) -> Result:
    """Each batch's checksum queued behind GPU work, its last reference dropped at once, while DALI
    decodes the next ones: the checksums must equal those taken at once. A batch whose memory went
    back to DALI (or to the hardware decoder, which writes at call time) while the step still read
    it would differ (torchcodec #1634, vision #9606)."""
    load = GpuLoad(device, HOLD_MS)
    loader = probe.loader("dali", device)
    loader.hw_decoder_load = hw_decoder_load
    loader.set_epoch(0)
    eager = [images.double().sum().item() for images, _, _ in itertools.islice(loader, probe.batches)]
    loader.set_epoch(0)
    late = []
    for images, _, _ in itertools.islice(loader, probe.batches):
        load()
        late.append(images.double().sum())
        del images
    torch.cuda.synchronize(device)
    return compare_sums(f"dali_handoff_hw{hw_decoder_load:g}", [s.item() for s in late], eager)


def _nvjpeg_library() -> ctypes.CDLL | None:
    """libnvjpeg: the nvidia-nvjpeg wheel's (the one DALI uses), else the system's."""
    spec = importlib.util.find_spec("nvidia")
    wheels = [p for loc in (spec.submodule_search_locations if spec else []) for p in
              sorted(glob.glob(f"{loc}/nvjpeg/lib/libnvjpeg.so*"))]
    for name in [*wheels, "libnvjpeg.so.13", "libnvjpeg.so.12", "libnvjpeg.so"]:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


def hardware_decoder_status() -> tuple[bool | None, str]:
    """(available, how it was found): nvjpegCreateEx with the hardware backend, as NVIDIA's nvJPEG
    samples probe it (NVJPEG_STATUS_ARCH_MISMATCH: none here). None when libnvjpeg is not found."""
    lib = _nvjpeg_library()
    if lib is None:
        return None, "libnvjpeg not found"
    handle = ctypes.c_void_p()
    status = lib.nvjpegCreateEx(NVJPEG_BACKEND_HARDWARE, None, None, 0, ctypes.byref(handle))
    if status == 0:
        lib.nvjpegDestroy(handle)
        return True, "nvjpegCreateEx(NVJPEG_BACKEND_HARDWARE) succeeded"
    why = "NVJPEG_STATUS_ARCH_MISMATCH" if status == NVJPEG_STATUS_ARCH_MISMATCH else f"nvJPEG status {status}"
    return False, f"nvjpegCreateEx(NVJPEG_BACKEND_HARDWARE): {why}"


def video_capability(env: Mapping[str, str]) -> bool | None:
    """Whether the container grants the `video` driver capability (NVIDIA container toolkit's
    NVIDIA_DRIVER_CAPABILITIES); None outside such a container (the variable unset)."""
    caps = env.get("NVIDIA_DRIVER_CAPABILITIES")
    if caps is None:
        return None
    return bool({"video", "all"} & {c.strip().lower() for c in caps.split(",")})


def hardware_decoder_result(available: bool | None, how: str, video: bool | None) -> Result:
    """The hardware decoder row: present (DALI sends it hw_decoder_load of the baseline JPEGs), or
    why not, with the container capability that hides it."""
    if available:
        return Result("nvjpeg_hardware", "pass", "present", f"{how}; DALI gives it 65% of baseline JPEGs "
                      "(hw_decoder_load); the rows hw0.65 and hw0 check both paths", {"available": True})
    if video is False:
        return Result("nvjpeg_hardware", "warn", "unavailable: the container lacks the video capability",
                      f"{how}. nvJPEG silently decodes on CUDA cores instead: start the container with "
                      "NVIDIA_DRIVER_CAPABILITIES=compute,utility,video (docker: --gpus "
                      "'\"capabilities=compute,utility,video\"')", {"available": False, "video": False})
    if available is None:
        return Result("nvjpeg_hardware", "skip", "unknown", how, {"available": None})
    return Result("nvjpeg_hardware", "info", "not on this GPU",
                  f"{how}: this GPU has no JPEG engine (A100, H100 and later data-centre GPUs have one); "
                  "nvJPEG decodes on CUDA cores", {"available": False, "video": video})
