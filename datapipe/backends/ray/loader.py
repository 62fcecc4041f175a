"""RayLoader: this rank leases its own batches to the pool, a bounded window at a time
(prefetch_factor x actors), and receives them in order; ranks share nothing in the data path. A batch
is a pure function of (dataset, seed, epoch, position, recipe), so a lease lost with its actor or node
is issued again to another actor and comes back the same. When no actor can run any more, the rest is
decoded here (one warning), or the epoch stops with PoolUnavailable when pool_fallback=False.
Normalization and the batch stage (mixup/cutmix/erasing) stay in this process, as the threads
backend's non-fused path has them; on CUDA the received uint8 batch is pinned and goes up on a side
stream one batch ahead (prefetch.ahead_on_stream); state_dict() is the base Loader's, so a run resumes in any backend.
pool_workers="auto": the trainer's waits are measured per window (`sizing`) and the pool resized; with
persistent_workers=False the pool's actors are released at the end of each iteration."""
from __future__ import annotations

import logging
import threading
import warnings
import weakref
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from ...errors import ExpectedError
from ...formats.base import Dataset
from ...order.sharding import READ_AHEAD_SHARDS, EpochOrder, ShardOrder
from ..base import Batch, Loader
from ..dataloader import KEEP_BATCHES, DecodedRecords, EpochBatches, Item, collate
from ..normalize import Normalizer
from ..options import LoaderOptions
from ..prefetch import ahead_on_stream
from ..threads import thread_view
from . import session
from .autoscale import Sizing
from .pool import ActorPool, Member

log = logging.getLogger(__name__)
POLL_S = 0.5  # how often a wait for a batch checks that its actor still runs


class PoolUnavailable(ExpectedError, RuntimeError):
    """No actor of the Ray pool can run (pool_fallback=False)."""


class PoolFallback(RuntimeWarning):
    """The Ray pool could not run: batches are decoded in the trainer process."""


class Lease:
    """One batch leased to the pool: its items, the member computing it and the answer (None: decoded here)."""

    def __init__(self, items: list[Item]) -> None:
        self.items, self.member, self.ref = items, None, None


def from_store(host: tuple) -> tuple:
    """A batch as an actor returned it, its images a tensor over the read-only NumPy array Ray maps from
    its object store (no copy: the normalization or the pinning reads it, nothing writes it)."""
    images, *rest = host
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "The given NumPy array is not writable", UserWarning)
        return (torch.from_numpy(images), *rest)


def host_bytes(host: tuple) -> int:
    """The bytes of a host batch's tensors (images, labels, indices): what its trip from an actor carries."""
    return sum(t.nbytes for t in host if isinstance(t, torch.Tensor))


def pinned(host: tuple) -> tuple:
    """A received host batch with its images and labels in page-locked memory (torch's caching host
    allocator reuses the blocks), so their copies to the GPU run asynchronously on a side stream."""
    images, labels, *rest = host
    return (images.pin_memory(), labels.pin_memory(), *rest)


def _close(pool: ActorPool | None, ray: Any, owned: bool) -> None:
    if pool is not None and ray.is_initialized():
        pool.close()
    session.shutdown(ray, owned)


class RayLoader(Loader):
    backend = "ray"

    def __init__(self, dataset: Dataset, order: EpochOrder | ShardOrder, options: LoaderOptions, *, reason: str = "") -> None:
        super().__init__(dataset, order, options, reason=reason)
        self.device = options.torch_device
        self.pin = options.pinned and torch.cuda.is_available()
        self.batch_order = EpochBatches(order, read_ahead=READ_AHEAD_SHARDS if dataset.location.remote else 0,
                                        size=options.image_size)
        self.normalize = Normalizer(self.device, options.dtype, options.channels_last, keep=KEEP_BATCHES,
                                    mean=options.recipe.mean, std=options.recipe.std)
        self._local: ThreadPoolExecutor | None = None  # the fallback's decode threads
        self._per_thread = threading.local()  # each fallback thread's DecodedRecords
        self.fell_back = False  # the one warning was given
        self.local_batches = 0  # batches decoded in this process (the fallback)
        self.received = 0  # batches received from the pool, all iterations
        self.iterations, self.closed = 0, False  # iterations started (the latest owns a non-persistent pool)
        self.sizing = Sizing()  # the trainer's waits, per window; resizes the pool with pool_workers="auto"
        self.received_bytes = self.received_images = 0  # host batches received from the pool (datapipe.bench)
        self.ray, owned = session.connect()
        self._finalizer = weakref.finalize(self, _close, None, self.ray, owned)  # Ray stopped even if the pool fails
        self.pool = ActorPool(self.ray, dataset, options, self.field_spec)
        self._finalizer.detach()
        self._finalizer = weakref.finalize(self, _close, self.pool, self.ray, owned)

    def close(self) -> None:
        """Stop the pool's actors, the fallback's threads, and the Ray this loader started (also when the
        loader is collected)."""
        self.closed = True
        if self._local is not None:
            self._local.shutdown(wait=False, cancel_futures=True)
        self._finalizer()

    @property
    def pool_history(self) -> list[tuple[int, int]]:
        return list(self.pool.size_history)

    @property
    def window(self) -> int:
        return self.options.prefetch_factor * max(1, len(self.pool.members))

    def _iterate(self, epoch: int, offset: int) -> Iterator[Batch | tuple[Batch, dict]]:
        if self.closed:
            raise ValueError("backend='ray': this loader was closed (its pool and Ray stopped); make a new one")
        hosts = self._host_batches(epoch, offset)
        try:  # on CUDA the next batch goes up on a side stream while this one trains (the prefetch backend's)
            yield from ahead_on_stream(self.device, hosts, self._hand_over)
        finally:
            hosts.close()  # now, not when collected: a non-persistent pool is released by its own iteration
            self.normalize.release()

    def _host_batches(self, epoch: int, offset: int) -> Iterator[tuple]:
        """The epoch's host batches from `offset`, in order (in pinned memory where batches go to CUDA)."""
        self.batch_order.epoch, self.batch_order.offset, self.batch_order.size = epoch, offset, self.image_size_at(epoch)
        batches = iter(self.batch_order)
        self.pool.refill()  # capacity lost in an earlier epoch may be back
        self.sizing.restart()
        self.iterations += 1
        mine = self.iterations  # an iteration abandoned earlier and ended later must not release this one's pool
        leases: deque[Lease] = deque()
        try:
            while True:
                while len(leases) < self.window and (items := next(batches, None)) is not None:
                    leases.append(Lease(items))
                    self._issue(leases[-1], leases)
                if not leases:
                    return
                asked = self.sizing.clock()
                busy, host = self._receive(leases)
                if busy is not None:
                    self._measured(asked, busy, leases)
                yield pinned(host) if self.pin else host
        finally:
            self._drop(leases, current=mine == self.iterations)
            if not self.options.persistent_workers and mine == self.iterations:
                self.pool.release()  # its CPUs back to the cluster until the next iteration

    def _drop(self, leases: deque[Lease], *, current: bool) -> None:
        """An iteration broken off (a break, an error): its leases still out are cancelled where their
        actor has not started them (an actor runs its calls in order: they would hold up the next
        iteration's), and, while no later iteration has begun (refill counts afresh), uncounted."""
        for lease in leases:
            if lease.ref is None:
                continue
            try:
                self.ray.cancel(lease.ref)
            except Exception as exc:  # an actor gone meanwhile: nothing left to cancel
                log.debug("datapipe: cancelling a broken-off lease: %s", exc)
            if current:
                lease.member.in_flight -= 1
        leases.clear()

    def _measured(self, asked: float, busy: float, leases: deque[Lease]) -> None:
        """One batch received from the pool: the window's figures, and with pool_workers="auto" the
        pool resized (a member given up meanwhile has its leases issued again)."""
        self.received += 1
        self.pool.settle()
        window = self.sizing.received(asked, busy)
        if window is None or self.options.pool_workers != "auto":
            return
        size = len(self.pool.members)
        wanted = self.sizing.wanted(window, size)
        if wanted > size:
            for member in self.pool.check():
                self._reissue(member, leases)
            if self.pool.grow(self.received):
                log.info("backend='ray': the pool grew to %d actors (the trainer waited %.0f%% of the last %d "
                         "batches)", self.pool.size, 100 * window.wait, self.sizing.window)
        elif wanted < size and (self.pool.shrink(self.received) or self.pool.size < size):
            log.info("backend='ray': the pool shrank to %d actors (the trainer waited %.0f%% of the last %d "
                     "batches)", self.pool.size, 100 * window.wait, self.sizing.window)

    def _issue(self, lease: Lease, leases: deque[Lease]) -> None:
        """Lease `lease` to the least busy member; with none left, decode it here (the fallback)."""
        member = self.pool.least_busy()
        if member is None:
            self._fall_back(leases)
            return
        lease.member, lease.ref = member, member.handle.batch.remote(lease.items)
        member.in_flight += 1

    def _receive(self, leases: deque[Lease]) -> tuple[float | None, tuple]:
        """(the actor's seconds of work or None where decoded here, the first lease's host batch), in
        order; its member lost meanwhile: issued again elsewhere."""
        ray, lease = self.ray, leases[0]
        while lease.ref is not None:
            done, _ = ray.wait([lease.ref], timeout=POLL_S)
            if not done:
                for member in self.pool.check():  # dead or unplaceable: its leases go elsewhere
                    self._reissue(member, leases)
                continue
            try:
                busy, host = ray.get(lease.ref)
            except ray.exceptions.RayTaskError as exc:  # the actor's code raised (on_error="raise", a bug)
                raise (exc.cause if isinstance(exc.cause, BaseException) else exc) from None
            except (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError, ray.exceptions.ObjectLostError,
                    ray.exceptions.NodeDiedError) as exc:
                member = lease.member
                self.pool.lost(member, exc)
                self._reissue(member, leases)
                continue
            lease.member.in_flight -= 1
            leases.popleft()
            host = from_store(host)
            self.received_bytes += host_bytes(host)
            self.received_images += len(host[2])
            return busy, host
        leases.popleft()
        self.local_batches += 1
        return None, collate(list(self._decoders().map(self._decode_here, lease.items)), self.field_spec)

    def _reissue(self, member: Member, leases: deque[Lease]) -> None:
        for lease in leases:
            if lease.member is member and lease.ref is not None:
                lease.member, lease.ref = None, None
                self.pool.reissued += 1
                self._issue(lease, leases)

    def _fall_back(self, leases: deque[Lease]) -> None:
        """No actor can run: every lease still out is decoded here (one warning), or PoolUnavailable."""
        why = self.pool.last_error or "no actor of the pool is left"
        if not self.options.pool_fallback:
            raise PoolUnavailable(f"backend='ray': no pool actor can run ({why}); pool_fallback=False: stopping "
                                  "(give pool_fallback=True to decode here instead, or add nodes with the resources)")
        if not self.fell_back:
            self.fell_back = True
            warnings.warn(f"backend='ray': no pool actor can run ({why}); decoding the batches in this process "
                          "instead (the same batches, at this process's speed)", PoolFallback, stacklevel=2)
        for lease in leases:
            if lease.member is not None:
                lease.member.in_flight -= 1
            lease.member, lease.ref = None, None

    def _decoders(self) -> ThreadPoolExecutor:
        """The fallback's decode threads, as many as the threads backend would run (started at the first
        batch decoded here, stopped with the loader)."""
        if self._local is None:
            self._local = ThreadPoolExecutor(max(1, self.options.workers), thread_name_prefix="datapipe-fallback")
            weakref.finalize(self, self._local.shutdown, wait=False, cancel_futures=True)
        return self._local

    def _decode_here(self, item: Item) -> tuple:
        """One sample decoded on a fallback thread, through that thread's own handles (threads.thread_view)."""
        records = getattr(self._per_thread, "records", None)
        if records is None:
            records = self._per_thread.records = DecodedRecords(thread_view(self.dataset), self.options, self.field_spec)
        return records[item]

    def _hand_over(self, host: tuple) -> Batch | tuple[Batch, dict]:
        """A host batch on the device: bad samples counted, images normalized, labels moved."""
        images, labels, indices, bad, *columns = host
        self.count_bad(bad)
        batch = self.normalize.batch(images, labels, indices)
        return batch if self.field_spec is None else (batch, columns[0])
