"""`datapipe doctor`: what to check before blaming the input pipeline, each with a plain hint."""
from __future__ import annotations

import os
import platform
import resource
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from ..augment.view import region_decoder_available
from ..backends import dali_installed
from ..bench.advice import machine_advice, measure_format
from ..formats import read_manifest
from ..formats.wds_foreign import shard_folder
from ..resources import available_cpus, cgroup_cpu_limit, cpus_per_rank
from ..storage import is_url, redact
from .bench import fitted, train_records

READ_PROBE_BYTES = 256 << 20
READ_MIN_BYTES = 32_000_000  # a read speed over less is not judged


@dataclass
class Check:
    name: str
    value: Any
    status: str = "ok"  # ok | warn | info
    hint: str = ""


def cores() -> int:
    """CPUs this process may use (affinity mask and cgroup quota: datapipe.resources)."""
    return available_cpus()


def _dali_version() -> str | None:
    if not dali_installed():
        return None
    import nvidia.dali

    return nvidia.dali.__version__


def dali_builds() -> list[str]:
    """The nvidia-dali-cuda* distributions installed (normally one)."""
    import importlib.metadata

    return sorted({d.metadata["Name"].lower() for d in importlib.metadata.distributions()
                   if (d.metadata["Name"] or "").lower().startswith("nvidia-dali-cuda")})


DALI_BUILDS = {"11": "nvidia-dali-cuda110", "12": "nvidia-dali-cuda120", "13": "nvidia-dali-cuda130"}
SHM_PER_GPU = 1 << 30
SHM_BATCH_BYTES = 256 * 224 * 224 * 3  # one uint8 batch of 256 images at 224 px, as DataLoader workers pass it


def dali_build_check(builds: list[str], torch_cuda: str | None) -> Check:
    """Whether the installed DALI build matches torch's CUDA major version (cu11, cu12 or cu13)."""
    from ..backends.dali import pip_hint

    value = ", ".join(builds) or "none"
    if not torch_cuda:
        return Check("dali_build", f"{value} (torch is a CPU build: DALI runs its CPU operators)", "info")
    want = DALI_BUILDS.get(torch_cuda.split(".")[0])
    if want is None:
        return Check("dali_build", f"{value}; torch uses CUDA {torch_cuda}", "warn",
                     f"DALI has no build for CUDA {torch_cuda}: install a torch for CUDA 12 or 13")
    if builds == [want]:
        return Check("dali_build", f"{value} matches torch's CUDA {torch_cuda}")
    return Check("dali_build", f"{value}; torch uses CUDA {torch_cuda}", "warn",
                 f"{pip_hint(torch_cuda)}, and uninstall other nvidia-dali-cuda* builds")


def video_capability_check(env: Mapping[str, str], *, nvcuvid: bool) -> Check:
    """The driver's `video` capability: without it nvJPEG's hardware JPEG decoder (A100, H100...) is
    unavailable and DALI silently decodes on CUDA cores. In a container the NVIDIA container toolkit
    grants it through NVIDIA_DRIVER_CAPABILITIES, and then mounts libnvcuvid, the driver's video library."""
    caps = env.get("NVIDIA_DRIVER_CAPABILITIES")
    granted = caps is None or bool({"video", "all"} & {c.strip().lower() for c in caps.split(",")})
    value = f"NVIDIA_DRIVER_CAPABILITIES={caps}" if caps is not None else "no container capabilities set"
    value += "; libnvcuvid " + ("found" if nvcuvid else "not found")
    if granted and nvcuvid:
        return Check("video_capability", value)
    return Check("video_capability", value, "warn",
                 "without the video capability the hardware JPEG decoder silently falls back to CUDA cores: "
                 "start the container with NVIDIA_DRIVER_CAPABILITIES=compute,utility,video (docker: --gpus "
                 "'\"capabilities=compute,utility,video\"'); `datapipe doctor --gpu` tests the decoder itself")


def nvcuvid_present() -> bool:
    """Whether the driver's video library loads (the container's video capability mounts it)."""
    import ctypes
    import ctypes.util

    try:
        ctypes.CDLL(ctypes.util.find_library("nvcuvid") or "libnvcuvid.so.1")
        return True
    except OSError:
        return False


def shm_check(total: int | None, *, gpus: int, workers: int, prefetch: int = 2) -> Check:
    """/dev/shm holds DataLoader workers' batches (workers x prefetch per rank) and the encoded batches
    of DALI's parallel source: warn under 1 GiB per GPU, or under what the default loader holds."""
    if total is None:
        return Check("dev_shm", "absent", "info", "no /dev/shm: DataLoader workers and DALI's source pass batches "
                                                   "through it; the loaders' shared memory then lives elsewhere")
    ranks = max(gpus, 1)
    need = max(SHM_PER_GPU * gpus, ranks * workers * prefetch * SHM_BATCH_BYTES)
    value = f"{total / 2**30:.1f} GiB"
    if total >= need:
        return Check("dev_shm", value)
    return Check("dev_shm", value, "warn",
                 f"under {need / 2**30:.1f} GiB ({ranks} rank(s) x {workers} workers x {prefetch} batches of 256 "
                 "images at 224 px, at least 1 GiB per GPU): workers fail with 'bus error' or 'No space left on "
                 "device'; run the container with --shm-size=16g (or --ipc=host)")


def _driver_version() -> str | None:
    if shutil.which("nvidia-smi") is None:
        return None
    out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True, timeout=20)
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None


def machine_info() -> dict[str, Any]:
    """The facts every benchmark result is stamped with."""
    import PIL

    gpu = None
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        gpu = {"name": p.name, "memory_gib": round(p.total_memory / 2**30, 1), "count": torch.cuda.device_count()}
    return {"cores": cores(), "gpu": gpu, "python": platform.python_version(), "torch": torch.__version__,
            "cuda": torch.version.cuda, "dali": _dali_version(), "pillow": PIL.__version__,
            "platform": platform.platform()}


def _gpu_checks() -> list[Check]:
    if not torch.cuda.is_available():
        return [Check("gpu", "none visible", "info", "no CUDA GPU visible: datapipe runs its CPU path "
                      "(default_backend below); check the driver and CUDA_VISIBLE_DEVICES if you expected one")]
    checks = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        checks.append(Check(f"gpu{i}", f"{p.name}, {p.total_memory / 2**30:.0f} GiB"))
    checks.append(Check("driver", _driver_version()))
    checks.append(Check("cudnn", torch.backends.cudnn.version(),
                        "ok" if torch.backends.cudnn.is_available() else "warn",
                        "" if torch.backends.cudnn.is_available() else "cuDNN missing: convolutions will be slow"))
    try:
        torch.empty(1 << 20, dtype=torch.uint8, pin_memory=True)
        checks.append(Check("pinned_memory", "allowed"))
    except RuntimeError as exc:
        checks.append(Check("pinned_memory", f"refused ({exc})", "warn",
                            "pinned memory failed: raise `ulimit -l` or the container's memlock limit"))
    return checks


@dataclass(frozen=True)
class DiskProbe:
    """How `doctor DATA` times the disk: it reads at most `limit` bytes of DATA's files and judges the speed
    only over `least` bytes or more (less is mostly the page cache and the clock); `clock` is the
    timer (a test injects one)."""

    limit: int = READ_PROBE_BYTES
    least: int = READ_MIN_BYTES
    clock: Callable[[], float] = time.perf_counter


def _data_checks(data: str, probe: DiskProbe) -> list[Check]:
    shown = redact(data)
    if is_url(data):
        return [Check("data", shown, "info", "in object storage: no disk here to check (the bench suites time reading "
                                             "it)")]
    path = Path(data)
    if not path.exists():
        return [Check("data", shown, "warn", "this path does not exist: pass the dataset or image folder you train on"
                      + (" (for a shard or Parquet pattern, the folder that holds the files)"
                         if any(c in data for c in "{*?") else ""))]
    usage = shutil.disk_usage(path if path.is_dir() else path.parent)
    free = Check("disk_free", f"{usage.free / 1e9:.1f} GB of {usage.total / 1e9:.1f} GB")
    if usage.free < 0.05 * usage.total:
        free.status, free.hint = "warn", "under 5% free: conversions (which stage their output) may fail"
    read, seconds = _time_reads(path, probe)
    mb_s = read / 1e6 / max(seconds, 1e-9)
    speed = Check("read_speed", f"{mb_s:.0f} MB/s over {read / 1e6:.1f} MB of {shown}")
    if read < probe.least:
        speed.status, speed.hint = "info", (f"too little to judge the disk (a verdict needs {probe.least / 1e6:.0f} "
                                            "MB): the figure is mostly the page cache and the clock")
    elif mb_s < 200:
        speed.status, speed.hint = "warn", "under 200 MB/s: ImageNet training needs ~250 MB/s per GPU; " + _faster(data)
    return [free, speed]


def _time_reads(path: Path, probe: DiskProbe) -> tuple[int, float]:
    """(bytes read, seconds) over `path`'s files, at most `probe.limit` bytes, uncached where the OS allows."""
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    read, started = 0, probe.clock()
    for f in files:
        with open(f, "rb") as fh:
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(fh.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)  # measure the disk, not the cache
            while read < probe.limit and (chunk := fh.read(8 << 20)):
                read += len(chunk)
        if read >= probe.limit:
            break
    return read, probe.clock() - started


def _faster(data: str) -> str:
    """What reads faster than `data` as it is: shards (unless it is shards already) or a local copy."""
    try:
        manifest = read_manifest(Path(data))
    except (ValueError, OSError):  # a damaged manifest: `datapipe verify` says so; the advice stays general
        manifest = None
    if (manifest is not None and manifest.format == "wds") or (Path(data).is_dir() and shard_folder(data)):
        return "these are WebDataset shards already (sequential reads): copy them to local NVMe"
    return ("pack into WebDataset shards (sequential reads) or copy the data to local NVMe; "
            + fitted(measure_format(shlex.quote(redact(data))), "read,pipeline", train_records(data), _device()))


def diagnose(data: str | Path | None, env: Mapping[str, str], *, probe: DiskProbe = DiskProbe()) -> list[Check]:
    """Every check; `env` is the process environment (passed in, read by the CLI); `probe`: how DATA's
    disk is timed. The commands the hints give run as printed (tests/test_doctor_commands.py)."""
    n = cores()
    checks = [Check("python", platform.python_version()), Check("torch", torch.__version__),
              Check("cuda", torch.version.cuda or "none (CPU build)")]
    checks += _gpu_checks()
    dali = _dali_version()
    checks.append(Check("dali", dali or "not installed", "ok" if dali else "info",
                        "" if dali else "pip install 'datapipe[dali]' for GPU (nvJPEG) decode and augmentation"))
    region = region_decoder_available()
    checks.append(Check("jpeg_region_decoder", "in use" if region else "not in use", "ok" if region else "warn",
                        "" if region else "the CPU train view decodes whole JPEGs (measured ~1.2x slower per core): "
                        "install libjpeg headers (apt-get install libjpeg-dev) and reinstall datapipe, or "
                        "see the warning logged at import if it was built but failed its self-check"))
    if dali:
        checks.append(dali_build_check(dali_builds(), torch.version.cuda))
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    quota = cgroup_cpu_limit()
    per = f"{cpus_per_rank(ranks=gpus)} per GPU process" if gpus else str(cpus_per_rank(ranks=1))
    workers = Check("cores", f"{n}{f' (cgroup quota {quota:g} CPUs)' if quota else ''}; "
                             f"default num_workers: {per}")
    if gpus and n < 4 * gpus:
        workers.status, workers.hint = "warn", ("fewer than 4 cores per GPU: CPU decode will starve it; decode on "
                                                "the GPU (DALI): see default_backend")
    checks.append(workers)
    if gpus:
        checks.append(video_capability_check(env, nvcuvid=nvcuvid_present()))
    shm = shutil.disk_usage("/dev/shm").total if os.path.isdir("/dev/shm") else None
    checks.append(shm_check(shm, gpus=gpus, workers=cpus_per_rank(ranks=max(gpus, 1))))
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    checks.append(Check("memlock_limit", "unlimited" if soft == resource.RLIM_INFINITY else f"{soft >> 10} KiB"))
    omp = env.get("OMP_NUM_THREADS")
    checks.append(Check("OMP_NUM_THREADS", omp or "unset",
                        "warn" if omp and omp.isdigit() and int(omp) > n else "ok",
                        f"larger than the {n} cores: threads will oversubscribe" if omp and omp.isdigit() and int(omp) > n else ""))
    alloc = env.get("PYTORCH_CUDA_ALLOC_CONF")
    checks.append(Check("PYTORCH_CUDA_ALLOC_CONF", alloc or "unset", "info" if gpus and not alloc else "ok",
                        "expandable_segments:True often lowers fragmentation with varying batch shapes"
                        if gpus and not alloc else ""))
    checks += advice_checks(data)
    if data is not None:
        checks += _data_checks(str(data), probe)
    return checks


def _device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def advice_checks(data: str | Path | None) -> list[Check]:
    """datapipe's default for each knob `datapipe bench` measures (bench/advice.py, the table bench's
    verdicts fall back to), each with the bench command that measures it on this machine and DATA
    (doctor.bench.fitted: one that runs on DATA as printed)."""
    device = _device()
    shown = shlex.quote(redact(str(data))) if data is not None else None
    records = train_records(str(data)) if data is not None else None
    return [Check(f"default_{a.knob}", f"{a.setting} ({a.why})", "info", fitted(a.measure(shown), a.suites, records,
                                                                                 device))
            for a in machine_advice(device, remote=data is not None and is_url(data))]


def as_json(checks: list[Check]) -> dict[str, Any]:
    return {"checks": [asdict(c) for c in checks], "machine": machine_info()}
