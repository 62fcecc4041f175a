"""Thread backend: decode + augment in threads of the rank process (libjpeg-turbo, the region decoder,
Pillow and torch's resize release the GIL). No worker processes, no pickling, no shared-memory
hand-off: one memory image however large the index.

Two ways to fill a batch (`ThreadLoader.fused`):
- fused (a CPU device): each decode thread normalizes its sample straight into its row of a new
  output batch, while the pixels are in its cache; the consumer only hands the batch over.
- ring (a CUDA device): samples are written as uint8 into a small ring of preallocated batch buffers
  (pinned), copied to the GPU and normalized there. The ring holds prefetch_factor + 1 buffers. A
  buffer is never handed to the caller: the normalizer reads it into a new tensor on the device, and
  the buffer is refilled only once that read is done (once an event recorded behind the copy has
  completed)."""
from __future__ import annotations

import atexit
import copy
import logging
import queue
import threading
import weakref
from collections import deque
from collections.abc import Callable, Iterator

import torch
from PIL import Image

from ..formats.base import Dataset, PerProcess
from ..mix.dataset import MixDataset
from ..order.sharding import EpochOrder, ShardOrder
from .bad_samples import BadSample
from .base import Batch, Loader
from .dataloader import DecodedRecords, EpochBatches, Item
from .normalize import Normalizer
from .options import LoaderOptions

log = logging.getLogger(__name__)
THREAD_PREFIX = "datapipe-decode"
JOIN_TIMEOUT_S = 30.0  # a thread finishes the sample it decodes, then stops: one decode, not a batch
POLL_S = 1.0  # how often a waiting consumer checks that the decode threads still run


def thread_view(dataset: Dataset) -> Dataset:
    """`dataset` sharing its indexes and arrays but with file handles of its own (its PerProcess
    attributes), as a worker process's copy has: one thread's shard-file LRU may close a descriptor
    another thread is reading."""
    if isinstance(dataset, MixDataset):  # each source's handles
        return dataset.with_datasets(tuple(thread_view(d) for d in dataset.datasets))
    view = copy.copy(dataset)
    for name, value in list(vars(view).items()):
        if isinstance(value, PerProcess):
            setattr(view, name, copy.copy(value))  # PerProcess.__getstate__: not opened yet
    return view


class Slot:
    """One preallocated uint8 NCHW batch buffer of the ring, and when it may be written again."""

    def __init__(self, batch_size: int, image_size: int, *, pin: bool, device: torch.device) -> None:
        self.images = torch.empty((batch_size, 3, image_size, image_size), dtype=torch.uint8, pin_memory=pin)
        self.device = device
        self._read: torch.cuda.Event | None = None

    def read_queued(self) -> None:
        """The normalizer queued its read of this buffer (asynchronous from pinned memory on CUDA)."""
        if self.device.type == "cuda":
            self._read = torch.cuda.Event()
            self._read.record(torch.cuda.current_stream(self.device))

    def wait_free(self) -> None:
        """Block until the last read of this buffer is done (at once on the CPU: it was synchronous)."""
        if self._read is not None:
            self._read.synchronize()
            self._read = None


def copy_row(row: torch.Tensor, pixels: torch.Tensor) -> None:
    row.copy_(pixels)


class BatchJob:
    """One batch being filled: its images (a ring slot's buffer, or a new output batch when there is
    no slot) and how a sample is written there; each sample's label, served index, BadSample and
    extra fields' values (when fields are asked for), the first error raised, and an event set once
    every sample is done."""

    def __init__(self, images: torch.Tensor, write: Callable[[torch.Tensor, torch.Tensor], None],
                 items: list[Item], slot: Slot | None = None) -> None:
        self.images, self.write, self.slot, self.items = images, write, slot, items
        size = len(items)
        self.labels, self.served = [0] * size, [0] * size
        self.bad: list[BadSample | None] = [None] * size
        self.values: list[tuple | None] = [None] * size
        self.error: BaseException | None = None
        self.done = threading.Event()
        self._left, self._lock = size, threading.Lock()

    def fill(self, records: DecodedRecords, k: int) -> None:
        """Decode sample k into its row of the buffer (run by a decode thread)."""
        try:
            pixels, self.labels[k], self.served[k], self.bad[k], *values = records[self.items[k]]
            if values:
                self.values[k] = values[0]
            self.write(self.images[k], pixels)
        except BaseException as exc:  # everything reaches the consumer, which raises it
            exc.add_note(f"(in thread {threading.current_thread().name}, serving record {self.items[k][1]})")
            self.error = self.error or exc
        with self._lock:
            self._left -= 1
            if self._left == 0:
                self.done.set()

    def host_batch(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(images, a view of the slot's buffer or the whole output batch; labels; served indices)
        once done."""
        return (self.images[:len(self.items)], torch.tensor(self.labels, dtype=torch.int64),
                torch.tensor(self.served, dtype=torch.int64))


def _decode_loop(tasks: queue.SimpleQueue, stop: threading.Event, make_records: Callable[[], DecodedRecords]) -> None:
    # Each decode thread is one core's worth of work: torch ops run here (the flip, the copy into the
    # batch, the normalize) would otherwise each start an OpenMP team whose threads spin on the cores
    # the other decode threads need (measured: 2.3x the CPU for those ops). This sets the calling
    # thread's OpenMP setting, and torch's default for threads started meanwhile (DecodePool.close
    # puts that back).
    torch.set_num_threads(1)
    records = make_records()
    while True:
        task = tasks.get()
        if task is None or stop.is_set():
            return
        job, k = task
        job.fill(records, k)


_RUNNING: weakref.WeakSet[DecodePool] = weakref.WeakSet()


@atexit.register
def _stop_running_pools() -> None:
    """Stop and join the decode threads of iterations still open when the interpreter exits (an
    iterator kept in a global, a notebook kernel shutting down): a daemon thread still inside torch
    or libjpeg when Python finalizes aborts the process ("terminate called without an active
    exception", exit status 134)."""
    for pool in list(_RUNNING):
        pool.close()


class DecodePool:
    """A fixed pool of named decode threads, each with its own view of the dataset, serving samples
    of submitted batches from one queue. `close()` stops and joins them."""

    def __init__(self, workers: int, make_records: Callable[[], DecodedRecords]) -> None:
        self.torch_threads = torch.get_num_threads()  # the caller's, put back as the default by close()
        self.tasks: queue.SimpleQueue = queue.SimpleQueue()
        self.stop = threading.Event()
        self.inline = make_records() if workers == 0 else None  # num_workers=0: decode in the caller
        self.threads = [threading.Thread(target=_decode_loop, args=(self.tasks, self.stop, make_records),
                                         name=f"{THREAD_PREFIX}-{k}", daemon=True) for k in range(workers)]
        for thread in self.threads:
            thread.start()
        _RUNNING.add(self)

    def submit(self, job: BatchJob) -> None:
        if job.slot is not None:
            job.slot.wait_free()
        for k in range(len(job.items)):
            if self.inline is not None:
                job.fill(self.inline, k)
            else:
                self.tasks.put((job, k))

    def wait(self, job: BatchJob) -> BatchJob:
        """The job once done; its first error raised here, in the consumer."""
        while not job.done.wait(POLL_S):
            if not any(t.is_alive() for t in self.threads):
                raise RuntimeError("the datapipe decode threads stopped before finishing a batch")
        if job.error is not None:
            raise job.error
        return job

    def close(self) -> bool:
        """Stop and join the threads; True when all stopped."""
        self.stop.set()
        for _ in self.threads:
            self.tasks.put(None)
        for thread in self.threads:
            thread.join(JOIN_TIMEOUT_S)
            if thread.is_alive():
                log.warning("%s did not stop within %.0f s of the iteration's end", thread.name, JOIN_TIMEOUT_S)
        torch.set_num_threads(self.torch_threads)  # the caller's own setting: unchanged by this call
        _RUNNING.discard(self)
        return not any(thread.is_alive() for thread in self.threads)


class ThreadLoader(Loader):
    """Decode threads fill batches prefetch_factor ahead, in order: normalized rows of new output
    batches on a CPU device (fused), else a ring of uint8 buffers normalized on the device."""

    backend = "threads"

    def __init__(self, dataset: Dataset, order: EpochOrder | ShardOrder, options: LoaderOptions, *, reason: str = "") -> None:
        if dataset.location.remote:
            raise ValueError(
                f"backend='threads' reads {dataset} from threads of this process, which may fork workers "
                "later: obstore cannot be used there (datapipe.storage.isolate), and forking a process whose "
                "decode threads run is unsafe. Use backend='dataloader' (or 'auto') for a remote dataset")
        super().__init__(dataset, order, options, reason=reason)
        self.device = options.torch_device
        self.batch_order = EpochBatches(order, size=options.image_size)
        # fused: prefetch_factor batches being filled, the one being handed over, the caller's, and
        # one a trainer may hold ahead (Lightning's fetcher): reused once let go of (BatchPool)
        self.normalize = Normalizer(self.device, options.dtype, options.channels_last, keep=options.prefetch_factor + 3,
                                    mean=options.recipe.mean, std=options.recipe.std)
        self.fused = self.device.type == "cpu"
        self._ring: list[Slot] | None = None  # kept between iterations (pinned memory is slow to allocate)

    def _take_ring(self) -> deque[Slot]:
        """The ring of prefetch_factor + 1 buffers: the kept one, or a new one when an iteration that
        was not closed still holds it."""
        o, ring, self._ring = self.options, self._ring, None
        if self.fused:
            return deque()
        if ring and ring[0].images.shape[-1] != self.batch_order.size:  # the image size changed (set_image_size)
            ring = None
        pin = o.pinned and torch.cuda.is_available()
        return deque(ring or [Slot(o.batch_size, self.batch_order.size, pin=pin, device=self.device)
                              for _ in range(o.prefetch_factor + 1)])

    def _records(self) -> DecodedRecords:
        return DecodedRecords(thread_view(self.dataset), self.options, self.field_spec)

    def _prime(self) -> None:
        """Open this process's shared handles (LMDB's one environment per path) before threads race to,
        and import Pillow's plugins here (it imports them on first use): a fork while a decode thread
        holds the import lock would leave the child's lock held (Python 3.11)."""
        Image.init()
        if len(self.dataset):
            try:
                self.dataset[0]
            except Exception:  # a bad record 0 is the on_error policy's business, when it is served
                pass

    def _iterate(self, epoch: int, offset: int) -> Iterator[Batch | tuple[Batch, dict]]:
        self.batch_order.epoch, self.batch_order.offset, self.batch_order.size = epoch, offset, self.image_size_at(epoch)
        batches = iter(self.batch_order)
        o, ring = self.options, self._take_ring()
        free = deque(ring)
        self._prime()
        pool = DecodePool(o.workers, self._records)
        pending: deque[BatchJob] = deque()

        def top_up() -> None:  # prefetch_factor batches decoding while the caller holds one
            while len(pending) < o.prefetch_factor and (items := next(batches, None)) is not None:
                pending.append(self._job(items, free))
                pool.submit(pending[-1])

        try:
            top_up()
            while pending:
                batch = self._hand_over(pool.wait(pending.popleft()), free)
                top_up()
                yield batch
        finally:
            if pool.close():  # no thread writes into the ring any more: the next iteration may reuse it
                self._ring = list(ring)
            self.normalize.release()

    def _job(self, items: list[Item], free: deque[Slot]) -> BatchJob:
        """A batch to fill: fused, an output batch that the threads normalize into (new, or the memory
        of one the caller has let go of); else the next free slot of the ring."""
        if self.fused:
            return BatchJob(self.normalize.empty(len(items), self.batch_order.size), self.normalize.sample_into, items)
        slot = free.popleft()
        return BatchJob(slot.images, copy_row, items, slot)

    def _hand_over(self, job: BatchJob, free: deque[Slot]) -> Batch | tuple[Batch, dict]:
        """The finished job as a device batch (with the extra fields' columns when fields are asked
        for); its slot, if any, goes back to the ring once read."""
        self.count_bad([b for b in job.bad if b is not None])
        if job.slot is None:
            batch = Batch(*job.host_batch())
        else:
            batch = self.normalize.batch(*job.host_batch())
            job.slot.read_queued()
            free.append(job.slot)
        return batch if self.field_spec is None else (batch, self.field_spec.columns(job.values))
