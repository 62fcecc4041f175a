"""`datapipe doctor --gpu`: every GPU path run on this machine's GPU and checked against the CPU path
on the same records (docs/gpu.md). Each check is one function returning a Result; one that raises
is a failure naming the error, and the others still run."""
from __future__ import annotations

import logging
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

import torch

from .report import Result, document, exit_status, failed, table

__all__ = ["Result", "document", "exit_status", "gpu_absent", "run_selftest", "table"]
log = logging.getLogger(__name__)
HW_LOADS = (0.65, 0.0)  # DALI's default share for the hardware JPEG decoder, and none


def gpu_absent() -> str | None:
    """The one line to print where there is no GPU to test, else None."""
    if torch.cuda.is_available():
        return None
    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU build"
    return f"no CUDA GPU visible (torch {torch.__version__}, {build}): the GPU self-test has nothing to run"


def _checks(probe, device: torch.device, env: Mapping[str, str]) -> list[tuple[str, Callable[[], Result | list[Result]]]]:
    from ...backends import dali_installed
    from . import amp, collective, decode, recipe_ops, transfer

    checks: list[tuple[str, Callable[[], Result | list[Result]]]] = [
        ("nvjpeg_hardware", lambda: decode.hardware_decoder_result(*decode.hardware_decoder_status(),
                                                                   decode.video_capability(env)))]
    if dali_installed():
        for load in HW_LOADS:
            checks.append((f"dali_decode_hw{load:g}", lambda load=load: decode.dali_versus_cpu(probe, device, hw_decoder_load=load)))
            checks.append((f"dali_handoff_hw{load:g}", lambda load=load: decode.dali_handoff(probe, device, hw_decoder_load=load)))
        checks.append(("recipe_ops", lambda: recipe_ops.recipe_op_results(device)))
    else:
        from ...backends.dali import pip_hint

        checks += [(name, lambda name=name: Result(name, "skip", "DALI not installed", pip_hint()))
                   for name in ("dali_decode", "recipe_ops")]
    checks += [
        ("prefetch_batches", lambda: transfer.prefetch_matches_dataloader(probe, device)),
        ("prefetch_overlap", lambda: transfer.prefetch_overlap(probe, device)),
        ("h2d_bandwidth", lambda: transfer.h2d_bandwidth(device)),
        ("amp_bf16", lambda: amp.amp_step(device, torch.bfloat16) if torch.cuda.is_bf16_supported() else
         Result("amp_bf16", "skip", "bf16 not supported", "this GPU predates bf16 (Ampere)")),
        ("amp_fp16", lambda: amp.amp_step(device, torch.float16)),
        ("nccl_all_reduce", lambda: collective.all_reduce_check(torch.cuda.device_count())),
    ]
    return checks


def run_selftest(data: str | Path | None, *, env: Mapping[str, str], progress: Callable[[str], None] | None = None) -> list[Result]:
    """Every check on GPU 0 (the current device), over `data` or, without it, a small synthetic image
    folder made in a temporary folder. `env`: the process environment (the CLI reads it)."""
    if not torch.cuda.is_available():
        raise RuntimeError(gpu_absent())
    from .probe import Probe
    from .sample import synthetic_folder

    device = torch.device("cuda", torch.cuda.current_device())
    with tempfile.TemporaryDirectory(prefix="datapipe-selftest-") as folder:
        path = data if data is not None else synthetic_folder(Path(folder) / "images")
        probe = Probe(path)
        results = [_gpu_row(device, path, data is None)]
        for name, check in _checks(probe, device, env):
            if progress:
                progress(name)
            try:
                outcome = check()
            except Exception as exc:  # one broken path must not hide the others
                log.debug("self-test check %s failed", name, exc_info=True)
                outcome = failed(name, exc)
            results += outcome if isinstance(outcome, list) else [outcome]
    return results


def _gpu_row(device: torch.device, data: str | Path, synthetic: bool) -> Result:
    p = torch.cuda.get_device_properties(device)
    source = "synthetic JPEGs" if synthetic else str(data)
    return Result("gpu", "info", f"{p.name}, sm_{p.major}{p.minor}, {p.total_memory / 2**30:.0f} GiB, "
                  f"{torch.cuda.device_count()} visible; torch {torch.__version__}",
                  f"records: {source}", {"name": p.name, "capability": f"{p.major}.{p.minor}",
                                         "count": torch.cuda.device_count(), "data": source})
