"""Host-to-device checks: the CUDA-stream prefetcher against the dataloader backend (the same
batches; copies overlapped with the step), and pinned against pageable copy bandwidth."""
from __future__ import annotations

import itertools

import torch

from .compare import bandwidth_result, compare_exact, overlap_result
from .probe import GpuLoad, Probe, collect_views
from .report import Result

STEP_MS = 40.0  # the stand-in step: long beside a small batch's decode, so the host can run ahead
COPY_BYTES = 64 << 20
COPY_REPEATS = 10


def prefetch_matches_dataloader(probe: Probe, device: torch.device) -> Result:
    """The prefetcher's batches equal the dataloader backend's on the same device, bit for bit."""
    plain = collect_views(probe.loader("dataloader", device), probe.batches)
    streamed = collect_views(probe.loader("prefetch", device), probe.batches)
    return compare_exact("prefetch_batches", streamed, plain)


def prefetch_overlap(probe: Probe, device: torch.device) -> Result:
    """Times each host-to-device copy (with the normalize after it) on the prefetcher's side stream
    and each step on the current stream with CUDA events; the copies should run during steps. The
    loop reads the previous step's end before queuing the next, as a loop reading its loss does."""
    load = GpuLoad(device, STEP_MS)
    loader = probe.loader("prefetch", device)
    copies: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
    to_device = loader.to_device

    def timed(*host):  # runs inside the prefetcher's `with torch.cuda.stream(side)`: events go there
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        batch = to_device(*host)
        end.record()
        copies.append((start, end))
        return batch

    loader.to_device = timed  # an instance attribute: the prefetcher's loop calls self.to_device
    origin = torch.cuda.Event(enable_timing=True)
    origin.record()
    steps: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
    loader.set_epoch(0)
    for images, _, _ in itertools.islice(loader, probe.batches):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        load()
        images.sum()  # the step reads the batch
        end.record()
        if steps:
            steps[-1][1].synchronize()
        steps.append((start, end))
    torch.cuda.synchronize(device)
    if not copies:
        return Result("prefetch_overlap", "fail", "no copies seen", "the prefetcher no longer calls to_device: "
                      "update datapipe/doctor/selftest/transfer.py to time its copies")

    def span(pair):
        return origin.elapsed_time(pair[0]), origin.elapsed_time(pair[1])

    return overlap_result("prefetch_overlap", [span(c) for c in copies], [span(s) for s in steps])


def _copy_rate(host: torch.Tensor, device: torch.device) -> tuple[float, bool]:
    """GB/s of `host` -> device copies timed with CUDA events, and whether the bytes arrived intact."""
    target = torch.empty(host.shape, dtype=host.dtype, device=device)
    target.copy_(host, non_blocking=True)  # warm-up
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(COPY_REPEATS):
        target.copy_(host, non_blocking=True)
    end.record()
    end.synchronize()
    seconds = start.elapsed_time(end) / 1e3
    intact = bool(torch.equal(target.cpu(), host))
    return host.numel() * host.element_size() * COPY_REPEATS / seconds / 1e9, intact


def h2d_bandwidth(device: torch.device, *, nbytes: int = COPY_BYTES) -> Result:
    """Pinned and pageable host-to-device bandwidth of the same bytes."""
    pattern = (torch.arange(nbytes, dtype=torch.int64) % 251).to(torch.uint8)
    pinned, pinned_ok = _copy_rate(pattern.pin_memory(), device)
    pageable, pageable_ok = _copy_rate(pattern, device)
    return bandwidth_result("h2d_bandwidth", pinned, pageable, intact=pinned_ok and pageable_ok)
