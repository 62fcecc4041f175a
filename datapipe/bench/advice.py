"""What datapipe uses on this machine when it is not told otherwise, knob by knob, and which bench
suite measures it. One table for two readers: `datapipe doctor` prints it (and says how to measure
each line), and `datapipe bench` marks the row that measures the default, which its verdicts
recommend whenever the measurement shows no effect. So the two never give different advice: doctor
gives the default, bench replaces it only with a measured effect."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..augment.view import region_decoder_available
from ..backends import choose_backend
from ..backends.options import LoaderOptions
from ..resources import cpus_per_rank


@dataclass(frozen=True)
class Advice:
    """One knob: datapipe's `setting` for it here, why, and the bench suites that measure it."""

    knob: str
    setting: str
    why: str
    suites: str

    def measure(self, data: str | None = None) -> str:
        """The command that measures this knob on `data` (the user's dataset)."""
        return f"measure it: datapipe bench {data or 'DATA'} --suites {self.suites}"


def default_backend(device: torch.device, *, remote: bool = False) -> tuple[str, str]:
    """`backend="auto"`'s choice and reason (datapipe.backends.choose_backend: the one rule)."""
    return choose_backend("auto", device, remote=remote)


def default_workers(device: torch.device) -> int:
    """num_workers for one rank: its share of the CPUs (datapipe.resources), on CUDA with one rank per
    visible GPU (a full-node run), which is what bench runs its loaders with too."""
    return cpus_per_rank(ranks=torch.cuda.device_count()) if device.type == "cuda" else LoaderOptions().workers


DEFAULT_PREFETCH_FACTOR = LoaderOptions().prefetch_factor


def default_memory(device: torch.device) -> str:
    """Host batch memory: pinned when batches go to a CUDA device (LoaderOptions.pinned)."""
    return "pinned" if device.type == "cuda" else "pageable"


def default_decode() -> str:
    """The train view decodes the crop box alone where the region decoder was built and passed its probe."""
    return "region" if region_decoder_available() else "whole"


def machine_advice(device: torch.device, *, remote: bool = False) -> list[Advice]:
    """The defaults on this machine for every knob bench measures, in the order doctor prints them."""
    backend, why = default_backend(device, remote=remote)
    advice = [
        Advice("backend", backend, f"auto: {why}", "pipeline"),
        Advice("workers", str(default_workers(device)), "num_workers=None: this rank's share of the CPUs", "loader"),
        Advice("prefetch_factor", str(DEFAULT_PREFETCH_FACTOR), "batches each worker prepares ahead", "loader"),
        Advice("decode", default_decode(), "the train view decodes the crop box alone where the region "
                                           "decoder is in use", "decode"),
    ]
    if device.type == "cuda":
        advice.append(Advice("pinned_memory", default_memory(device), "page-locked host batches copy to the "
                                                                      "GPU asynchronously", "h2d"))
    return advice


def measure_format(data: str | None = None) -> str:
    """How to measure a packed format against the data as it is."""
    data = data or "DATA"
    return (f"measure it: datapipe convert {data} COPY.wds, then datapipe bench {data} COPY.wds "
            "--suites read,pipeline")
