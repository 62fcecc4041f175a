"""Benchmark suites: each measures one stage on one dataset and returns Rows.

Every suite times its runs with window.timed (warm-up, then the clock until `seconds` pass or the epoch
ends, less the drain); the figure is the median over `repeats` runs, and a row whose windows were too
short to measure a throughput says so instead (sanity.py).

Each Case also names the knob settings it stands for (`knobs`, e.g. {"backend": "threads"}) and which
of them are datapipe's defaults on this machine (advice.py): verdicts.py compares rows by those.
"""
from __future__ import annotations

import logging
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..augment.resolution import check_image_size
from ..augment.view import plan_and_decode, region_decoder_available, set_region_decoding
from ..backends import make_loader
from ..backends.registry import backend_names, local_backends
from ..backends.threads import THREAD_PREFIX
from ..errors import first_line
from ..formats.base import Dataset
from ..formats.folder import FolderDataset
from ..image.decode import decode_rgb
from .advice import DEFAULT_PREFETCH_FACTOR, default_backend, default_decode, default_memory, default_workers
from .baselines import naive_loader, plain_dali_loader
from .meter import WorkerProcesses, decode_threads
from .pool import PoolRuns, ray_installed
from .sanity import LOADER_SUITES, MIN_BATCHES_PER_WORKER, too_short
from .window import DRAIN_BATCHES, NoBatchLeft, Timing, timed

log = logging.getLogger(__name__)


__all__ = ["BenchOptions", "Case", "Row", "SUITES", "Timing", "timed", "DRAIN_BATCHES", "NoBatchLeft"]


@dataclass(frozen=True)
class BenchOptions:
    """What to run and how long; validated once."""

    backends: tuple[str, ...] = field(default_factory=local_backends)
    batch_size: int = 64
    image_size: int = 224
    seconds: float = 10.0
    repeats: int = 3
    warmup: int = 2
    workers: int | None = None
    simulate_step_ms: float = 0.0
    split: str = "train"
    device: str | None = None
    sampling: str = "auto"
    cache_dir: str | None = None
    cache_limit: int | None = None
    recipe: str | None = None  # a preset name (datapipe.augment): the loader suites serve that recipe
    pool_workers: tuple[int, ...] = ()  # backend="ray": one pipeline row per pool size (empty: `workers`'s)
    pool_resources: tuple[tuple[str, float], ...] = ()  # backend="ray": each actor's Ray resources, e.g. datapipe=1
    min_batches: int = MIN_BATCHES_PER_WORKER  # a loader row's window needs this many batches per worker (sanity.py)

    def __post_init__(self) -> None:
        if self.recipe is not None:
            from ..augment.recipe import resolve_recipe

            resolve_recipe(self.recipe)  # a ValueError naming the presets
        unknown = set(self.backends) - set(backend_names())
        if unknown:
            raise ValueError(f"unknown backends {sorted(unknown)}; choose from {', '.join(backend_names())}")
        if any(not isinstance(n, int) or isinstance(n, bool) or n < 1 for n in self.pool_workers):
            raise ValueError(f"pool_workers must be pool sizes >= 1, e.g. (1, 2); got {self.pool_workers!r}")
        if self.repeats < 1 or not self.seconds > 0 or self.batch_size < 1 or self.warmup < 0 or self.min_batches < 1:
            raise ValueError("repeats, batch_size and min_batches must be >= 1, seconds > 0, warmup >= 0; got "
                             f"repeats={self.repeats}, batch_size={self.batch_size}, min_batches={self.min_batches}, "
                             f"seconds={self.seconds}, warmup={self.warmup}")
        if not self.simulate_step_ms >= 0:  # NaN too
            raise ValueError(f"simulate_step_ms must be >= 0, got {self.simulate_step_ms}")
        check_image_size(self.image_size)  # the decode suite resizes to it without a loader's check


@dataclass
class Row:
    """One measured figure (median of runs) and what it measured."""

    data: str
    format: str
    suite: str
    backend: str
    images_per_s: float
    mb_per_s: float | None = None
    data_wait_pct: float | None = None
    runs: list[float] = field(default_factory=list)
    note: str = ""
    knobs: dict[str, str] = field(default_factory=dict)
    defaults: list[str] = field(default_factory=list)
    trainer_cpu_ms_per_image: float | None = None  # this process's CPU (meter.py), loader rows only
    pool_cpu_ms_per_image: float | None = None  # the loader's workers' CPU (meter.py), where it can be read
    bytes_per_image: float | None = None  # what mb_per_s counts: a record read, a host batch received (ray)
    batches_per_worker: float | None = None  # in the shortest window (loader rows; sanity.py)
    needs_records: int | None = None  # a too-short row: the records an epoch needs for a throughput


@dataclass
class Case:
    """One thing to time: `run(repeat)` makes one timed run and returns its Timing. `workers`: the
    loader's workers, whose look-ahead its window must outlast (0: a suite without look-ahead)."""

    data: str
    format: str
    suite: str
    backend: str
    run: Callable[[int], Timing] | None
    bytes_per_image: float | None = None
    note: str = ""
    knobs: dict[str, str] = field(default_factory=dict)  # knob -> the setting this case measures (verdicts.py)
    defaults: list[str] = field(default_factory=list)  # knobs whose setting here is datapipe's default (advice.py)
    workers: int = 0
    records: int | None = None  # the dataset's (run_bench sets it)

    def row(self, results: list[Timing], opts: "BenchOptions") -> Row:
        """The median figures, or a row that says why it has none (skipped, failed, too short)."""
        labels = dict(knobs=self.knobs, defaults=self.defaults)
        head = (self.data, self.format, self.suite, self.backend)
        counted = [t.batches for t in results if t.batches is not None]
        per_worker = min(counted) / max(1, self.workers) if counted and self.workers else None
        short = too_short(results, self.workers, opts, self.records) if not self.note else None
        if self.note or short or not results:
            note, needs = short or (self.note, None)
            return Row(*head, 0.0, note=note, **labels, batches_per_worker=per_worker, needs_records=needs)
        rate = statistics.median(t.images_per_s for t in results)
        wait = statistics.median(t.wait_pct for t in results) if opts.simulate_step_ms and self.suite != "h2d" else None
        mb = rate * self.bytes_per_image / 1e6 if self.bytes_per_image else None
        loader = self.suite in LOADER_SUITES
        cpu = statistics.median(t.cpu_ms_per_image for t in results) if loader else None
        pools = [t.pool_cpu_ms_per_image for t in results]
        pool = statistics.median(pools) if loader and None not in pools else None
        return Row(*head, rate, mb, wait, [round(t.images_per_s, 1) for t in results], **labels,
                   trainer_cpu_ms_per_image=cpu, pool_cpu_ms_per_image=pool, bytes_per_image=self.bytes_per_image,
                   batches_per_worker=per_worker)


def suite_read(name: str, ds: Dataset, opts: BenchOptions, device: torch.device) -> list[Case]:
    """Raw record reads in random order, one process, no decode: records/s and MB/s."""
    order = np.random.default_rng(0).permutation(len(ds))
    mean_bytes = float(np.mean([len(ds[int(i)].data) for i in order[:256]]))

    def batches(_: int):
        for start in range(0, len(order), opts.batch_size):
            yield [ds[int(i)] for i in order[start:start + opts.batch_size]]

    return [Case(name, ds.format, "read", "-", timed(batches, len, opts, device, step=False), mean_bytes,
                 knobs={"format": ds.format})]


def _decodable(blob: bytes) -> bool:
    try:
        decode_rgb(blob).load()
        return True
    except Exception:  # a bad file in a plain folder: the loaders skip it, so does this suite
        return False


def suite_decode(name: str, ds: Dataset, opts: BenchOptions, device: torch.device) -> list[Case]:
    """One core's decode rate: a full PIL decode to RGB, and the train view (decode, crop, resize)
    decoding whole images beside decoding the crop box alone (where datapipe._jpeg_region is built)."""
    blobs = [b for b in (ds[i].data for i in range(min(len(ds), 512))) if _decodable(b)]

    def pil_batches(_: int):
        for start in range(0, len(blobs), opts.batch_size):
            yield [decode_rgb(b).load() for b in blobs[start:start + opts.batch_size]]

    def train_views(first: int, repeat: int, region: bool) -> list[torch.Tensor]:
        # one core: torch's resize would otherwise start an OpenMP team (1.9 cores busy for the rate of
        # one here), which collapses when anything else wants the cores
        previous, threads = set_region_decoding(region), torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return [plan_and_decode(b, None, 0, repeat, first + i, opts.image_size, train=True)[0]
                    for i, b in enumerate(blobs[first:first + opts.batch_size])]
        finally:
            set_region_decoding(previous)
            torch.set_num_threads(threads)

    def view_batches(repeat: int, region: bool):
        return (train_views(first, repeat, region) for first in range(0, len(blobs), opts.batch_size))

    if not blobs:
        note = f"skipped: none of the first {min(len(ds), 512):,} records decodes"
        return [Case(name, ds.format, "decode", label, None, note=note)
                for label in ("pil-1-core", "train-view-whole")]
    cases = [Case(name, ds.format, "decode", "pil-1-core", timed(pil_batches, len, opts, device, step=False))]
    for region in (False, True) if region_decoder_available() else (False,):
        run = timed(lambda repeat, region=region: view_batches(repeat, region), len, opts, device, step=False)
        view = "region" if region else "whole"
        cases.append(Case(name, ds.format, "decode", f"train-view-{view}", run, knobs={"decode": view},
                          defaults=["decode"] if view == default_decode() else []))
    return cases


def _loader_case(name: str, ds: Dataset, opts: BenchOptions, device: torch.device, suite: str, backend: str,
                 label: str, **overrides: Any) -> Case:
    """A Case timing one epoch per repeat of make_loader(ds, backend, **overrides), or a skipped one."""
    if backend == "threads" and ds.location.remote:
        return Case(name, ds.format, suite, label, None,
                    note="skipped: a remote dataset is read by worker processes (docs/loaders.md)")
    workers = opts.workers if opts.workers is not None else default_workers(device)
    settings = dict(num_workers=workers) | overrides
    try:
        loader = make_loader(ds, backend=backend, batch_size=opts.batch_size, image_size=opts.image_size,
                             device=opts.device, sampling=opts.sampling, recipe=opts.recipe,
                             max_bad_fraction=1.0, **settings)  # speed is measured here, not data health
    except ImportError as exc:
        return Case(name, ds.format, suite, label, None, note=f"skipped: {exc}")
    processes = WorkerProcesses()
    pool = {"threads": decode_threads(THREAD_PREFIX), "dataloader": processes, "prefetch": processes}.get(backend)
    pool = pool if settings["num_workers"] else None  # no workers: the trainer decodes, its figure is the pool's

    def batches(repeat: int):
        processes.mark()
        loader.set_epoch(repeat)
        return loader

    run = timed(batches, lambda b: len(b.images), opts, device, pool=pool)
    return Case(name, ds.format, suite, label, run, workers=settings["num_workers"])


def suite_pipeline(name: str, ds: Dataset, opts: BenchOptions, device: torch.device) -> list[Case]:
    """The full train pipeline (decode, RandomResizedCrop, flip, normalize, on the device) per backend.
    The row of auto's backend also stands for datapipe against the naive baseline and for the format."""
    auto, _ = default_backend(device, remote=ds.location.remote)
    cases = []
    for backend in opts.backends:
        if backend == "ray":
            cases += _pool_cases(name, ds, opts, device)
            continue
        case = _loader_case(name, ds, opts, device, "pipeline", backend, backend)
        case.knobs, case.defaults = {"backend": backend}, []
        if backend == auto:
            case.knobs |= {"loader": backend, "format": ds.format}
            case.defaults += ["backend", "loader"]
        if device.type == "cuda" and backend in ("prefetch", "dataloader"):
            case.knobs["cuda_stream"] = "on" if backend == "prefetch" else "off"
            case.defaults += ["cuda_stream"] if backend == "prefetch" else []
        cases.append(case)
    return cases


def _pool_cases(name: str, ds: Dataset, opts: BenchOptions, device: torch.device) -> list[Case]:
    """backend="ray" at each pool size (pool.py); the row whose pool has as many CPUs as the other
    backends' workers also stands for the backend, against auto's."""
    workers = opts.workers if opts.workers is not None else default_workers(device)
    if not ray_installed():
        return [Case(name, ds.format, "pipeline", "ray", None, note="skipped: Ray is not installed: "
                     "pip install 'datapipe[ray]'")]
    settings = dict(batch_size=opts.batch_size, image_size=opts.image_size, device=opts.device,
                    sampling=opts.sampling, recipe=opts.recipe, max_bad_fraction=1.0,
                    pool_resources=dict(opts.pool_resources) or None)
    cases = []
    for size in opts.pool_workers or (workers,):
        runs = PoolRuns(ds, size, settings)
        case = Case(name, ds.format, "pipeline", f"ray p={size}", None, knobs={"pool_workers": str(size)},
                    workers=size)
        if size == workers:  # pool_workers=None's pool: num_workers actors
            case.knobs["backend"], case.defaults = "ray", ["pool_workers"]
        timing = timed(runs, lambda b: len(b.images), opts, device, pool=runs.cpu_meter)

        def run(repeat: int, case: Case = case, runs: PoolRuns = runs,
                timing: Callable[[int], Timing] = timing) -> Timing:
            result = timing(repeat)
            case.bytes_per_image = runs.bytes_per_image
            return result

        case.run = run
        cases.append(case)
    return cases


def suite_loader(name: str, ds: Dataset, opts: BenchOptions, device: torch.device) -> list[Case]:
    """auto's backend at num_workers = W (--workers, else the default), W/2 and 2W, and at
    prefetch_factor 4 beside the default 2: the two loader knobs tuning guides argue over most."""
    backend, _ = default_backend(device, remote=ds.location.remote)
    default = default_workers(device)
    workers = opts.workers if opts.workers is not None else default
    pf = DEFAULT_PREFETCH_FACTOR
    settings = [(workers, pf)] + [(w, pf) for w in sorted({max(1, workers // 2), 2 * workers} - {workers})]
    cases = []
    for w, p in settings + [(workers, 2 * pf)]:
        case = _loader_case(name, ds, opts, device, "loader", backend, f"{backend} w={w} pf={p}",
                            num_workers=w, prefetch_factor=p)
        case.knobs = {"workers": str(w), "prefetch_factor": str(p)}
        case.defaults = [k for k, ok in (("workers", w == default), ("prefetch_factor", p == pf)) if ok]
        cases.append(case)
    return cases


def suite_baseline(name: str, ds: Dataset, opts: BenchOptions, device: torch.device) -> list[Case]:
    """The naive ImageFolder-style DataLoader (and, on an image folder, DALI's plain CPU pipeline)."""
    workers = opts.workers if opts.workers is not None else default_workers(device)  # as every loader row
    loader = naive_loader(ds, batch_size=opts.batch_size, size=opts.image_size, workers=workers)
    processes = WorkerProcesses()

    def naive_batches(_: int):
        processes.mark()
        for images, labels in loader:
            yield images.to(device, non_blocking=True), labels

    naive = timed(naive_batches, lambda b: len(b[0]), opts, device, pool=processes)
    cases = [Case(name, ds.format, "baseline", "naive-imagefolder", naive, knobs={"loader": "naive-imagefolder"},
                  workers=workers)]
    if isinstance(ds, FolderDataset) and "dali" in opts.backends:
        try:
            records = range(len(ds))
            dali = plain_dali_loader([str(ds.file_path(i)) for i in records], [ds.index.label(i) for i in records],
                                     batch_size=opts.batch_size, size=opts.image_size, workers=workers)
        except ImportError as exc:
            return cases + [Case(name, ds.format, "baseline", "plain-dali-cpu", None, note=f"skipped: {exc}")]
        except Exception as exc:  # its reader stops at the first file it cannot read (an empty one, say)
            return cases + [Case(name, ds.format, "baseline", "plain-dali-cpu", None,
                                 note=f"failed: DALI's plain pipeline cannot read this folder: {first_line(exc)}")]
        run = timed(lambda _: (out[0] for out in dali), lambda b: len(b["images"]), opts, device)
        cases.append(Case(name, ds.format, "baseline", "plain-dali-cpu", run, knobs={"loader": "plain-dali-cpu"},
                          workers=workers))
    return cases


def suite_h2d(name: str, ds: Dataset, opts: BenchOptions, device: torch.device) -> list[Case]:
    """Host-to-device copy of one uint8 batch, pinned vs pageable memory (CUDA only)."""
    if device.type != "cuda":
        return []
    cases = []
    per_image = opts.image_size * opts.image_size * 3
    for kind in ("pinned", "pageable"):
        host = torch.empty(opts.batch_size * per_image, dtype=torch.uint8, pin_memory=kind == "pinned")

        def batches(_: int, host=host):
            for _ in range(200):
                yield host.to(device, non_blocking=True)

        cases.append(Case(name, "-", "h2d", kind, timed(batches, lambda b: opts.batch_size, opts, device, step=False),
                          per_image, knobs={"pinned_memory": kind},
                          defaults=["pinned_memory"] if kind == default_memory(device) else []))
    return cases


SUITES: dict[str, Callable[[str, Dataset, BenchOptions, torch.device], list[Case]]] = {
    "read": suite_read, "decode": suite_decode, "baseline": suite_baseline,
    "pipeline": suite_pipeline, "loader": suite_loader, "h2d": suite_h2d,
}
