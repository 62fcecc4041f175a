"""One rule for how many CPUs a process may use and how many workers each rank gets.

On an 8-GPU node with 224 CPUs, `os.cpu_count()` workers in each of 8 ranks (and again for the val
loader, and again for DALI's threads) is thousands of processes fighting for 224 cores. The rule:
the CPUs this process may run on (its affinity mask, capped by the cgroup CPU quota a container
sets) divided by the ranks on this node, at least 1. The loaders, DALI, `convert` and `doctor` all
ask here.
"""
from __future__ import annotations

import math
import os
import sys
from collections.abc import Mapping
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")


def cgroup_cpu_limit(root: Path = CGROUP) -> float | None:
    """The CPU quota of this process's cgroup in CPUs (cgroup v2 `cpu.max`, v1 `cpu.cfs_quota_us`),
    None when there is none. Containers (Docker `--cpus`, Kubernetes limits) set it; the affinity
    mask still shows every host CPU there."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return quota / period if quota > 0 and period > 0 else None
    except (OSError, ValueError):
        return None


def available_cpus(root: Path = CGROUP) -> int:
    """CPUs this process may use: its affinity mask, capped by the cgroup quota (rounded up)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    limit = cgroup_cpu_limit(root)
    if limit is not None:
        cpus = min(cpus, max(1, math.ceil(limit)))
    return max(1, cpus)


def local_world_size(environ: Mapping[str, str] | None = None) -> int:
    """Ranks on this node: torchrun's LOCAL_WORLD_SIZE; else, in an initialized process group, its
    world size capped by the GPUs visible (one rank per GPU on a node); else 1."""
    environ = os.environ if environ is None else environ
    value = environ.get("LOCAL_WORLD_SIZE", "")
    if value.isdigit() and int(value) > 0:
        return int(value)
    torch = sys.modules.get("torch")
    if torch is None:  # no process group without torch; do not import it (convert, info start fast)
        return 1
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        world = dist.get_world_size()
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        return min(world, gpus) if gpus else world
    return 1


def cpus_per_rank(environ: Mapping[str, str] | None = None, root: Path = CGROUP, *, ranks: int | None = None) -> int:
    """This rank's share of the node's CPUs (`ranks` on the node, else local_world_size()): what
    worker pools and decode threads default to."""
    return max(1, available_cpus(root) // (ranks or local_world_size(environ)))
