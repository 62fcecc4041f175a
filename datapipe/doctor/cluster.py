"""`datapipe doctor --ray`: the Ray cluster a backend="ray" pool would run on (nodes alive, their CPUs,
GPUs and custom resources such as `datapipe`) and the pool's sizing there (pool_sizing.py): the cores it
needs, and decoded uint8 against JPEG + plan on the link. Only a running cluster is described (an
address given, RAY_ADDRESS, or the Ray this process is connected to); none is ever started, and a Ray
that is absent or unreachable is one line."""
from __future__ import annotations

import importlib.metadata
import sys
from dataclasses import dataclass
from typing import Any

from ..errors import counted
from ..pool_sizing import DEIT_CPU_S_PER_IMAGE, GPU_IMAGES_PER_S, JPEG_BYTES, pool_cores, wire, wire_lines
from ..pool_sizing import capacity
from ..ray_setup import RayUnreachable, join
from ..storage.redaction import redact
from .pipeline import Check

POOL_RESOURCE = "datapipe"
HIDDEN = ("memory", "object_store_memory", "node:", "accelerator_type:")  # Ray's own entries, not the user's


@dataclass(frozen=True)
class SizingOptions:
    """The figures the sizing lines use; images_per_s None: 3,000 per GPU of the cluster (none: no sizing)."""

    images_per_s: float | None = None
    image_size: int = 224
    jpeg_bytes: int = JPEG_BYTES
    link_gbit: float = 100.0
    cpu_s_per_image: float = DEIT_CPU_S_PER_IMAGE


def ray_version() -> str | None:
    try:
        return importlib.metadata.version("ray")
    except importlib.metadata.PackageNotFoundError:
        return None


def connect(address: str | None) -> tuple[Any, bool]:
    """(ray, whether this call connected): the Ray this process is connected to, else the cluster at
    `address`, joined as every path does (ray_setup.join: probed, one line within JOIN_TIMEOUT_S).
    Never starts a Ray."""
    import ray

    if ray.is_initialized():
        return ray, False
    if address is None:
        raise RayUnreachable("not connected to a Ray cluster: give --ray [HOST:PORT] or set RAY_ADDRESS")
    join(ray, address)
    return ray, True


def user_resources(resources: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in sorted(resources.items())
            if k not in ("CPU", "GPU") and not any(k == h or (h.endswith(":") and k.startswith(h)) for h in HIDDEN)}


def node_line(node: dict[str, Any]) -> str:
    """'10.0.0.5: 64 CPUs, 0 GPUs, datapipe: 64'."""
    have = node.get("Resources", {})
    extra = "".join(f", {k}: {v:g}" for k, v in user_resources(have).items())
    return f"{node.get('NodeManagerAddress', '?')}: {have.get('CPU', 0):g} CPUs, {have.get('GPU', 0):g} GPUs{extra}"


def cluster_checks(nodes: list[dict[str, Any]], sizing: SizingOptions = SizingOptions()) -> list[Check]:
    """The cluster in ray.nodes()'s words, then the sizing at its image rate. Pure: tested with dicts."""
    alive = [n for n in nodes if n.get("Alive")]
    total = {k: sum(n.get("Resources", {}).get(k, 0) for n in alive) for k in ("CPU", "GPU", POOL_RESOURCE)}
    checks = [Check("ray_cluster", f"{counted(len(alive), 'node')} alive ({len(nodes) - len(alive)} dead): "
                                   f"{counted(total['CPU'], 'CPU')}, {counted(total['GPU'], 'GPU')}, "
                                   f"{POOL_RESOURCE}: {total[POOL_RESOURCE]:g}")]
    checks += [Check(f"ray_node{i}", node_line(n)) for i, n in enumerate(alive)]
    room = capacity(alive, {"CPU": 1, POOL_RESOURCE: 1})  # pool actors: 1 CPU and 1 of pool_resources each
    if not room:
        checks[0].status, checks[0].hint = "info", (
            f"no node offers the {POOL_RESOURCE!r} resource: pool actors go wherever a CPU is free, GPU nodes "
            f"included; start CPU-only nodes with `ray start --address=HEAD:6379 --num-gpus=0 --resources="
            f"'{{\"{POOL_RESOURCE}\": N}}'` and give pool_resources={{'{POOL_RESOURCE}': 1}} (docs/clusters.md)")
    return checks + sizing_checks(int(total["GPU"]), room, sizing)


def sizing_checks(gpus: int, room: int, sizing: SizingOptions) -> list[Check]:
    """The pool's cores and network at the image rate given, else at 3,000 img/s a GPU of the cluster;
    a cluster without GPUs and no rate given: one line asking for the rate (none is made up)."""
    if sizing.images_per_s is None and gpus == 0:
        return [Check("pool_cores", f"no GPUs in the cluster to size the pool for; the {POOL_RESOURCE} nodes hold "
                                    f"{room:g} pool actors", "info",
                      f"give --images-per-s, the rate the trainer consumes (~{GPU_IMAGES_PER_S:,} img/s an H100 on "
                      "DeiT), for the pool's cores and network")]
    rate = sizing.images_per_s or GPU_IMAGES_PER_S * gpus
    why = "given" if sizing.images_per_s else f"{gpus} GPU(s) x {GPU_IMAGES_PER_S:,} img/s, DeiT on an H100"
    cores = pool_cores(rate, sizing.cpu_s_per_image)
    enough = room >= cores
    checks = [Check("pool_cores", f"~{cores:,.0f} pool cores for {rate:,.0f} img/s ({why}; "
                    f"{sizing.cpu_s_per_image * 1e3:.2f} CPU-ms/img); the {POOL_RESOURCE} nodes hold {room:g}",
                    "ok" if enough else "warn",
                    "" if enough else f"add CPU-only nodes with {POOL_RESOURCE} resources, or decode on the GPUs (DALI)")]
    w = wire(rate, image_size=sizing.image_size, jpeg_bytes=sizing.jpeg_bytes, link_gbit=sizing.link_gbit)
    first, *rest = wire_lines(w)
    checks.append(Check("pool_network", f"{first}; a {sizing.link_gbit:g} Gbit/s link",
                        "ok" if w.choice == "uint8" else "warn", "; ".join(rest)))
    return checks


def ray_checks(address: str | None, sizing: SizingOptions = SizingOptions()) -> list[Check]:
    """The cluster section: described when this process is connected to a Ray or `address` is given
    (HOST:PORT, or 'auto': the one `ray start` runs here); else one line saying how to ask for it."""
    version = ray_version()
    connected = "ray" in sys.modules and sys.modules["ray"].is_initialized()
    if version is None:
        return [Check("ray", "not installed (pip install 'datapipe[ray]' for backend='ray' and this section)",
                      "info" if address is None else "warn")]
    if address is None and not connected:
        return [Check("ray", f"{version}; no cluster checked (`datapipe doctor --ray [HOST:PORT]` or RAY_ADDRESS "
                             "describes a running one)", "info")]
    try:
        ray, here = connect(address)
    except RayUnreachable as exc:
        return [Check("ray_cluster", redact(f"unreachable: {exc}"), "warn")]
    try:
        nodes = ray.nodes()
    finally:
        if here:
            ray.shutdown()  # a driver's disconnect: the cluster runs on
    return cluster_checks(nodes, sizing)
