"""Sizing a CPU pool beside GPUs, as pure arithmetic (docs/clusters.md, "Sizing the pool"): the cores
a pool needs for an image rate, and what the network carries at that rate when the pool ships decoded
uint8 pixels (backend="ray" today) against shipping the JPEG bytes and their plan for a GPU decode;
and what one pool actor asks of a cluster: its resources, checked against Ray's limits, and how many
actors the live nodes hold."""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .checks import integer, real, shown

# Our loader's CPU cost on the DeiT recipe at 224 px, one core of this project's 2-core machine: 2.41-2.82
# CPU-s per 1,000 images; the upper figure sizes a pool.
DEIT_CPU_S_PER_IMAGE = 2.82e-3
GPU_IMAGES_PER_S = 3000  # one H100 training on the DeiT recipe, the rate a pool is sized for per GPU
JPEG_BYTES = 110_000  # ImageNet-1k's train JPEGs: ~140 GB / 1.28M images
PLAN_BYTES = 512  # a SamplePlan pickled, with its key and label (the presets' plans: <= 285 bytes)
UTILISATION = 0.8  # the share of a pool core spent decoding (Ray's processes, the object store, slack)
# Ray's limits on an amount of a custom resource: a node offers at most MAX_RESOURCE_QUANTITY of one
# (ray_constants; `ray start` refuses more, so a larger request never runs), and an amount counts in
# steps of 0.0001 (RESOURCE_UNIT_SCALING: a smaller one is refused). Above ~1e304, Ray's own check
# overflows (OverflowError naming no option).
RAY_MAX_RESOURCE = 100e12
RAY_RESOURCE_STEP = 1e-4


def pool_cores(images_per_s: float, cpu_s_per_image: float = DEIT_CPU_S_PER_IMAGE,
               utilisation: float = UTILISATION) -> float:
    """Cores a pool needs: images/s x CPU-s per image / utilisation."""
    real("images_per_s", images_per_s, 0)
    real("cpu_s_per_image", cpu_s_per_image, 0)
    real("utilisation", utilisation, 0, 1, low_open=True)
    return images_per_s * cpu_s_per_image / utilisation


def uint8_bytes(image_size: int) -> int:
    """A decoded H x W x 3 uint8 image: what the pool ships per image."""
    return image_size * image_size * 3


@dataclass(frozen=True)
class Wire:
    """At `images_per_s`: the bytes per second each way of shipping needs, against a link."""

    images_per_s: float
    uint8_bytes: int  # per image: decoded pixels (H x W x 3)
    jpeg_bytes: int  # per image: the encoded bytes and the plan (the GPU decodes: DALI, nvJPEG)
    link_bytes_per_s: float

    @property
    def uint8_rate(self) -> float:
        return self.images_per_s * self.uint8_bytes

    @property
    def jpeg_rate(self) -> float:
        return self.images_per_s * self.jpeg_bytes

    @property
    def uint8_max_images_per_s(self) -> float:
        """The image rate at which decoded uint8 fills the link: above it, ship JPEGs."""
        return self.link_bytes_per_s / self.uint8_bytes

    @property
    def jpeg_max_images_per_s(self) -> float:
        return self.link_bytes_per_s / self.jpeg_bytes

    @property
    def choice(self) -> str:
        """'uint8' where decoded pixels fit on the link, else 'jpeg' where the encoded bytes do, else 'neither'."""
        if self.uint8_rate <= self.link_bytes_per_s:
            return "uint8"
        return "jpeg" if self.jpeg_rate <= self.link_bytes_per_s else "neither"


def wire(images_per_s: float, *, image_size: int = 224, jpeg_bytes: int = JPEG_BYTES, link_gbit: float = 100.0,
         plan_bytes: int = PLAN_BYTES) -> Wire:
    """What shipping `images_per_s` needs: decoded at `image_size` px, or `jpeg_bytes` + a plan each,
    against a link of `link_gbit` Gbit/s."""
    real("images_per_s", images_per_s, 0)
    size, jpeg = integer("image_size", image_size, 1), integer("jpeg_bytes", jpeg_bytes, 1)
    real("link_gbit", link_gbit, 0, low_open=True)
    return Wire(images_per_s, uint8_bytes(size), jpeg + plan_bytes, link_gbit * 1e9 / 8)


def gb(rate: float) -> str:
    return f"{rate / 1e9:.2f} GB/s ({rate * 8 / 1e9:.1f} Gbit/s)"


def wire_lines(w: Wire) -> list[str]:
    """The comparison in words, one line each: each way's rate and its share of the link, then the choice."""
    share = lambda rate: f"{100 * rate / w.link_bytes_per_s:.0f}% of the link"  # noqa: E731
    lines = [f"at {w.images_per_s:,.0f} img/s: uint8 ({w.uint8_bytes / 1e3:.0f} KB/img) needs {gb(w.uint8_rate)}, "
             f"{share(w.uint8_rate)}; JPEG + plan ({w.jpeg_bytes / 1e3:.0f} KB/img) needs {gb(w.jpeg_rate)}, "
             f"{share(w.jpeg_rate)}",
             f"the link fills at {w.uint8_max_images_per_s:,.0f} img/s of uint8, {w.jpeg_max_images_per_s:,.0f} "
             "img/s of JPEG + plan"]
    lines.append({"uint8": "ship decoded uint8 (backend='ray' as built): it fits on the link",
                  "jpeg": "ship JPEG + plan and decode on the GPU: decoded uint8 does not fit on the link",
                  "neither": "neither fits on the link: a faster link, smaller images or fewer images/s a node"}[w.choice])
    return lines


def resource_pairs(value: Any, name: str = "pool_resources") -> tuple[tuple[str, float], ...]:
    """`value` (a mapping, or (name, amount) pairs) as sorted (name, amount) pairs a Ray actor may ask
    for: custom resource names (not CPU or GPU: each actor takes one CPU), amounts within Ray's limits."""
    items = value.items() if isinstance(value, Mapping) else value
    try:
        pairs = tuple(sorted((key, amount) for key, amount in items))
    except (TypeError, ValueError):
        pairs = None
    if (pairs is None or not all(isinstance(n, str) and n and n not in ("CPU", "GPU") for n, _ in pairs)
            or len({n for n, _ in pairs}) < len(pairs)):
        raise ValueError(f"{name} must map Ray custom resource names, each once (not CPU or GPU: each actor takes "
                         f"one CPU), to amounts, e.g. {{'datapipe': 1}}; got {shown(value)}")
    return tuple((key, real(f"{name}[{key!r}]", amount, RAY_RESOURCE_STEP, RAY_MAX_RESOURCE,
                            note=" (Ray's limits: a node offers at most 1e14 of a resource, counted in steps of "
                                 "0.0001)")) for key, amount in pairs)


def capacity(nodes: Iterable[Mapping[str, Any]], needs: Mapping[str, float]) -> int:
    """How many actors needing `needs` the live nodes (ray.nodes()) hold in all, busy or not."""
    held = 0
    for node in nodes:
        have = node.get("Resources", {})
        if node.get("Alive"):
            held += min(int(have.get(k, 0.0) // v) for k, v in needs.items())
    return held
