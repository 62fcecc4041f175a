"""DALI backend: the epoch order's records, read by a parallel external_source, decoded by DALI (nvJPEG
`mixed` on CUDA, CPU operators otherwise) into the same views as the other backends.

One pipeline serves every epoch and every resume: its worker processes start once (under `spawn`
on CUDA that takes seconds), and each epoch after the first starts within about one batch's time.
Every format (folder included) goes through the same source, so DALI follows datapipe.order.sharding like
the other backends: one global permutation per epoch, interleaved rank slices, elastic resume,
substitution of bad records. DALI's own readers (readers.file, readers.webdataset) shard and shuffle
by themselves and stop at a bad file, so they are not used.
"""
from __future__ import annotations

import logging
import multiprocessing.connection
import os
import shutil
import signal
import tempfile
import weakref
from collections.abc import Iterator

import numpy as np
import torch

from ...formats.base import Dataset, DatasetReplaced
from ...mix.dataset import refuse_other_fills
from ...order.sharding import EpochOrder, ShardOrder, record_of
from ...storage.redaction import mask_library_output
from ..bad_samples import BadSample, record_path
from ..base import Batch, Loader
from ..deaths import UNKNOWN_EXIT, WorkerDied, exit_description, worker_died, workers_start_deaf
from ..fields import TokenizerFailed, check_picklable
from ..options import LoaderOptions
from .graph import HW_DECODER_LOAD, build_pipeline, thread_budget
from .handoff import Handoff
from .source import EpochTable, PlannedSource, ViewSettings

log = logging.getLogger(__name__)
PIPELINE_OUTPUT = {torch.float16: "float16", torch.uint8: "uint8"}  # the pipeline's image dtype; float32 otherwise


def pip_hint(cuda: str | None = None) -> str:
    """What to install: the DALI build for torch's CUDA major version (`cuda`: torch.version.cuda).
    CUDA 11 has no datapipe extra: its DALI build, nvidia-dali-cuda110, ended at 1.50."""
    cuda = torch.version.cuda if cuda is None else cuda
    major = (cuda or "").split(".")[0]
    if major == "11":
        return f"pip install 'nvidia-dali-cuda110>=1.30' (the DALI build for torch's CUDA {cuda}; its last release is 1.50)"
    extra = "dali-cu13" if major == "13" else "dali-cu12"
    return f"pip install 'datapipe[{extra}]' (the DALI build for torch's CUDA {cuda or 'none (a CPU build of torch)'})"


def choose_start_method(requested: str | None, *, cuda_device: bool, cuda_initialized: bool) -> str:
    """How DALI starts its source workers: as requested, else spawn on a CUDA device or once CUDA
    is initialised in this process (DALI refuses to fork then), else fork (fast)."""
    if requested:
        return requested
    return "spawn" if cuda_device or cuda_initialized else "fork"


def cuda_initialized() -> bool:
    """Whether anything in this process initialised the CUDA driver: torch, or DALI itself (which
    torch.cuda.is_initialized() cannot see; DALI's own check before a fork sees both)."""
    if torch.cuda.is_initialized():
        return True
    from nvidia.dali import backend

    return bool(backend.IsDriverInitialized())


def require_dali():
    """The nvidia.dali module, or an ImportError naming the extra to install. What DALI logs or warns is
    redacted from here on (its AutoGraph's warnings quote what it traced); its CSE switch was set when
    this package imported augment.dali (graph.py)."""
    mask_library_output()
    try:
        import nvidia.dali
        import nvidia.dali.plugin.pytorch  # noqa: F401
    except ImportError as exc:
        raise ImportError(f"the dali backend needs NVIDIA DALI: {pip_hint()}") from exc
    return nvidia.dali


JOIN_DYING_S = 5.0  # a killed worker's threads end within milliseconds; its exit code is waited for this long
OBSERVER_S = 10.0  # DALI's pool stops its other workers (SIGTERM, a join) within milliseconds of a death


def _proc_pool(pipe):
    """A built pipeline's pool of parallel external_source workers, or None. DALI has no public call
    for it: this reads its pool (2.x: Pipeline._py_pool.pool, a ProcPool that keeps multiprocessing
    Processes and an Observer thread) and finds none if that changes."""
    return getattr(getattr(pipe, "_py_pool", None), "pool", None)


def source_worker_exits(pipe) -> list[tuple[int, int | None]]:
    """(pid, exit code or None while it runs) of a built pipeline's parallel external_source workers."""
    processes = getattr(_proc_pool(pipe), "_processes", None) or []
    return [(p.pid, _exit_code(p)) for p in processes if p.pid is not None]


def await_pool_stop(pipe) -> None:
    """After a source worker died, before the pipeline is dropped: wait until DALI's pool has seen the
    death and stopped itself. Its observer thread does that when it wakes, but a pool closed before
    (the pipeline's finalizer calls pool.close()) takes the close for a clean one and wakes the workers
    waiting on its task queue, and multiprocessing's Condition.notify waits forever for the dead one
    to wake: under load, the observer woke after the loader had dropped the pipeline, and the next
    epoch hung. An observer still running after OBSERVER_S (on a lock the dead worker held) is
    detached, so that no close waits for it, and the workers it did not stop are stopped here."""
    pool = _proc_pool(pipe)
    observer = getattr(pool, "_observer", None)
    thread = getattr(observer, "thread", None)
    if thread is None:
        return
    thread.join(OBSERVER_S)
    if not thread.is_alive():
        return
    log.warning("DALI's worker pool did not stop within %g s of a source worker's death; stopping its "
                "workers without it", OBSERVER_S)
    observer.thread = None
    for process in getattr(pool, "_processes", None) or []:
        if process.pid is not None and process.exitcode is None:
            process.terminate()


def _exit_code(process) -> int | None:
    """A worker's exit code, None while it runs. Asking DALI for work while a worker is dead or
    dying waits forever (multiprocessing's Condition.notify), so dying counts: a killed worker's
    main thread is a zombie at once while its other threads still exit, and only then does its
    sentinel say so. DALI's observer thread may reap it first: the code is then taken from there."""
    if not (multiprocessing.connection.wait([process.sentinel], timeout=0) or _dying(process.pid)):
        return None
    process.join(JOIN_DYING_S)
    return process.exitcode if process.exitcode is not None else UNKNOWN_EXIT


def _dying(pid: int) -> bool:
    """Its main thread has exited (a zombie) while other threads may still run (Linux /proc)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except (OSError, IndexError):
        return False


class DaliLoader(Loader):
    """One DALI pipeline per loader, read through DALI's PyTorch iterator, positioned per epoch
    through an EpochTable."""

    backend = "dali"

    def __init__(self, dataset: Dataset, order: EpochOrder | ShardOrder, options: LoaderOptions, *, reason: str = "") -> None:
        require_dali()
        super().__init__(dataset, order, options, reason=reason)
        self.device = options.torch_device
        if self.device.type == "cuda" or options.start_method == "spawn":  # the source workers are spawned
            check_picklable(options.tokenizer, "DALI's source workers")
            if self.mix is not None:
                self.mix.check_picklable("DALI's source workers")
        if self.mix is not None and options.train:
            refuse_other_fills(dataset, options.recipe)
        folder = tempfile.mkdtemp(prefix="datapipe-dali-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
        self._finalizer = weakref.finalize(self, shutil.rmtree, folder, True)
        self.table = EpochTable.create(folder)
        settings = ViewSettings(options.image_size, options.train, options.seed, options.on_error == "skip",
                                not dataset.validated, options.recipe, gpu_decode=self.device.type == "cuda")
        self.source = PlannedSource(dataset, order, self.table, settings, self.field_spec)
        self.threads, self.py_workers = thread_budget(max(1, options.workers), cuda=self.device.type == "cuda")
        self.hw_decoder_load = HW_DECODER_LOAD  # set before the first batch: 0 keeps JPEGs off the hardware decoder
        self._handoff = Handoff(self.device) if self.device.type == "cuda" else None
        self._pipe = None
        self._iterator = None
        self._dali_epoch = -1

    @property
    def start_method(self) -> str:
        """spawn on CUDA or once CUDA is initialised in this process (DALI refuses fork then, even
        for a CPU pipeline); fork otherwise (fast), unless options say."""
        return choose_start_method(self.options.start_method, cuda_device=self.device.type == "cuda",
                                   cuda_initialized=cuda_initialized())

    def _build(self) -> None:
        from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

        cuda = self.device.type == "cuda"
        seed = int(np.random.default_rng([self.options.seed, self.shard.rank]).integers(2**31))
        self._pipe = build_pipeline(
            self.source, batch_size=self.order.batch_size, threads=self.threads, py_workers=self.py_workers,
            device_id=self.device.index if cuda else None, start_method=self.start_method, seed=seed,
            channels_last=self.options.channels_last, output=PIPELINE_OUTPUT.get(self.options.dtype, "float32"),
            recipe=self.options.recipe, hw_decoder_load=self.hw_decoder_load,
            preallocate=self.options.train)
        with workers_start_deaf():  # its source workers start here (deaths.shield_worker)
            self._pipe.build()
        names = ["images", "labels", "indices", "replaced"] + (["fields", "fields_len"] if self.field_spec else [])
        self._iterator = DALIGenericIterator([self._pipe], names,
                                             last_batch_policy=LastBatchPolicy.PARTIAL, auto_reset=False,
                                             prepare_first_batch=False)

    def _position(self, epoch: int, offset: int) -> None:
        """Point the next DALI epoch at (epoch, offset) and its image size: write its table row, stop
        and drain the previous DALI epoch (at most the batches DALI had prefetched), then reset into
        the new one. A new size needs no new pipeline: the workers read it from the row."""
        size = self.image_size_at(epoch)
        if self._pipe is None:
            self._dali_epoch = 0
            self.table.write(0, epoch, self.order.encode(offset, epoch), size=size)
            self._build()
            return
        self._dali_epoch += 1
        self.table.write(self._dali_epoch, epoch, self.order.encode(offset, epoch), size=size)
        self.table.stop(self._dali_epoch - 1)
        drained = 0
        try:
            while True:
                next(self._iterator)
                drained += 1
        except StopIteration:
            pass
        if drained:
            log.debug("dropped %d prefetched DALI batches of an abandoned epoch", drained)
        self._iterator.reset()

    def _iterate(self, epoch: int, offset: int) -> Iterator[Batch | tuple[Batch, dict]]:
        count = self.order.num_batches(offset)
        if count == 0:
            return
        self._check_workers()
        try:
            self._position(epoch, offset)
        except Exception as exc:
            raise self._lost_worker() or exc
        for number in range(count):
            self._check_workers()
            try:
                outputs = next(self._iterator)[0]
            except StopIteration:
                raise RuntimeError(f"DALI ended epoch {epoch} after {number} of {count} batches") from None
            except Exception as exc:
                raise self._failure(exc, epoch, offset, number) from None
            batch = self._to_batch(outputs, epoch)
            yield batch if self.field_spec is None else (batch, self._field_columns(outputs))

    def _field_columns(self, out: dict[str, torch.Tensor]) -> dict:
        """The extra fields' columns from the source's padded UTF-8 JSON per sample (source.padded)."""
        blobs, lengths = out["fields"].cpu().numpy(), out["fields_len"].reshape(-1).tolist()
        spec = self.field_spec
        return spec.columns([spec.from_wire(blobs[k, :n].tobytes()) for k, n in enumerate(lengths)])

    def _check_workers(self) -> None:
        """Raise WorkerDied if a source worker died since the last call into DALI. Checked before
        each call: asked for work after one died while it waited for some, DALI waits forever for
        it to wake (multiprocessing's Condition.notify), at the start of an epoch for instance."""
        lost = self._lost_worker()
        if lost is not None:
            raise lost

    def _lost_worker(self) -> WorkerDied | None:
        """A WorkerDied naming the source worker that died, or None while none did. When one exits,
        DALI's pool stops the others (SIGTERM) and its pipeline answers "Worker data receiving
        interrupted", then fails for good: the pipeline is dropped once the pool has stopped
        (await_pool_stop), and the next iteration builds anew."""
        exits = [(pid, code) for pid, code in source_worker_exits(self._pipe) if code not in (None, 0)]
        if not exits:
            return None
        pid, code = next(((p, c) for p, c in exits if c != -signal.SIGTERM), exits[0])
        await_pool_stop(self._pipe)
        self._pipe = self._iterator = None
        return worker_died(self.backend, "a DALI source worker process", pid, exit_description(code))

    def _failure(self, exc: Exception, epoch: int, offset: int, number: int) -> Exception:
        """The pipeline's error, with the records it may concern (a worker's message names its record)."""
        lost = self._lost_worker()
        if lost is not None:
            return lost
        lines = [l for l in str(exc).strip().splitlines() if l.strip()]
        for own in (DatasetReplaced, TokenizerFailed):  # the store changed under a source worker, or the
            if any(f"{own.__name__}: " in l for l in lines):  # tokenizer failed: not a record's fault
                return own(str(exc))
        named = next((l for l in reversed(lines) if "cannot read or decode record" in l), None)
        if named is not None:
            return RuntimeError(named.split("RuntimeError: ", 1)[-1])
        batches = self.order.batches(epoch, offset)[number:number + 3]
        suspects = [record_path(self.dataset, record_of(int(i), len(self.dataset))) for b in batches for i in b][:8]
        return RuntimeError(f"DALI failed in epoch {epoch} at batch {number}: {lines[-1] if lines else exc}. "
                            f"The batch in flight held: {', '.join(suspects)}. DALI cannot skip a sample its "
                            "decoder rejects: convert the data with `datapipe convert`, which skips and reports them")

    def _to_batch(self, out: dict[str, torch.Tensor], epoch: int) -> Batch:
        indices = out["indices"].reshape(-1).to("cpu", torch.int64)
        replaced = out["replaced"].reshape(-1).to("cpu", torch.int64)
        if bool((replaced >= 0).any()):
            self.count_bad([BadSample(r, record_path(self.dataset, r), self.source.problem(epoch, r) or "rejected", i)
                            for r, i in zip(replaced.tolist(), indices.tolist()) if r >= 0])
        images = out["images"].permute(0, 3, 1, 2) if self.options.channels_last else out["images"]
        fmt = torch.channels_last if self.options.channels_last else torch.contiguous_format
        labels = out["labels"].reshape(-1)
        if self._handoff is None:  # a CPU pipeline: host memory DALI keeps while it is referenced
            images = images.to(self.options.dtype).contiguous(memory_format=fmt)
            return Batch(images, labels.to(torch.int64), indices)
        images = self._handoff.own(images, dtype=self.options.dtype, memory_format=fmt)  # handoff.py
        labels = self._handoff.own(labels, dtype=torch.int64)
        self._handoff.keep(out)
        return Batch(images, labels, indices)
