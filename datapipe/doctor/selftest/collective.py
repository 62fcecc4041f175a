"""All-reduce over this machine's GPUs: one spawned process per GPU, NCCL, each rank's answer checked
and the bus bandwidth measured as nccl-tests defines it (busbw = algbw * 2(n-1)/n). With
backend="gloo" the same harness runs on CPU (the tests)."""
from __future__ import annotations

import json
import socket
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import torch

from .report import Result

REPEATS = 5


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _rank(rank: int, world: int, port: int, folder: str, backend: str, numel: int) -> None:
    """One rank: all-reduce rank+1 everywhere (the sum is n(n+1)/2), then time REPEATS all-reduces."""
    import torch.distributed as dist

    outcome: dict = {}
    try:
        device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=timedelta(seconds=60), device_id=device if backend == "nccl" else None)
        data = torch.full((numel,), float(rank + 1), device=device)
        dist.all_reduce(data)
        expected = world * (world + 1) / 2
        outcome["correct"] = bool((data == expected).all().item())
        dist.barrier()
        started = time.perf_counter()
        for _ in range(REPEATS):
            dist.all_reduce(data)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        outcome["seconds"] = (time.perf_counter() - started) / REPEATS
    except Exception as exc:  # reported to the parent, whatever it is
        outcome["error"] = f"{type(exc).__name__}: {exc}"[:300]
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    Path(folder, f"rank{rank}.json").write_text(json.dumps(outcome))


def all_reduce_check(world: int, *, backend: str = "nccl", nbytes: int = 64 << 20, timeout: float = 180) -> Result:
    """`world` ranks all-reduce a float32 tensor of `nbytes`; every rank must hold the right sum."""
    from torch.multiprocessing.spawn import start_processes

    check = f"{backend}_all_reduce"
    if world < 2:
        return Result(check, "skip", f"{world} GPU", "one GPU: there is nothing to all-reduce across")
    numel = max(1, nbytes // 4)
    with tempfile.TemporaryDirectory() as folder:
        context = start_processes(_rank, args=(world, _free_port(), folder, backend, numel), nprocs=world,
                                  join=False, start_method="spawn")
        join_within(context, timeout)
        reports = [Path(folder, f"rank{r}.json") for r in range(world)]
        outcomes = [json.loads(p.read_text()) if p.is_file() else {"error": "timed out"} for p in reports]
    return all_reduce_result(check, outcomes, nbytes=numel * 4)


def join_within(context, timeout: float) -> None:
    """Wait for torch.multiprocessing's spawned ranks for `timeout` seconds at most; kill those still
    running then (a rank waiting for a peer that died would wait forever)."""
    deadline = time.monotonic() + timeout
    while not context.join(timeout=max(0.0, deadline - time.monotonic())):
        if time.monotonic() >= deadline:
            for process in context.processes:
                if process.is_alive():
                    process.kill()
                process.join()
            return


def all_reduce_result(check: str, outcomes: list[dict], *, nbytes: int) -> Result:
    """Every rank's outcome -> pass (all correct), or fail naming the ranks that erred or were wrong."""
    world = len(outcomes)
    errors = {r: o["error"] for r, o in enumerate(outcomes) if "error" in o}
    if errors:
        return Result(check, "fail", f"{len(errors)} of {world} ranks failed",
                      "; ".join(f"rank {r}: {e}" for r, e in errors.items()), {"errors": errors})
    wrong = [r for r, o in enumerate(outcomes) if not o.get("correct")]
    seconds = max(o["seconds"] for o in outcomes)
    algbw = nbytes / seconds / 1e9 if seconds > 0 else 0.0
    busbw = algbw * 2 * (world - 1) / world
    values = {"ranks": world, "bytes": nbytes, "algbw_gb_s": round(algbw, 2), "busbw_gb_s": round(busbw, 2)}
    figure = f"{world} ranks, {nbytes >> 20} MiB: busbw {busbw:.1f} GB/s"
    if wrong:
        return Result(check, "fail", figure, f"ranks {wrong} hold a wrong sum", values)
    return Result(check, "pass", figure, values=values)
