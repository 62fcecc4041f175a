"""The pool: N BatchActors (`pool_workers`), each placed with `pool_resources` (a Ray custom resource
keeps them to CPU-only nodes), one CPU each. A member that died (its node was lost, it was killed) or
cannot be placed (no node of the cluster holds its resources, or it is not up START_S after it was
asked for) is given up and started afresh in its place, a bounded number of times per epoch; the
loader re-issues the member's leased batches to the others."""
from __future__ import annotations

import logging
import time
from typing import Any

from ...formats.base import Dataset
from ..fields import FieldSpec
from ..options import LoaderOptions
from .actor import BatchActor

log = logging.getLogger(__name__)
START_S = 60.0  # an actor that a node could hold but is not up by then is given up (a node starting is seconds)


class Member:
    """One actor of the pool: its handle, the answer to its `ready` call, when it was asked for, and
    the leases in flight on it."""

    def __init__(self, handle: Any, ready: Any) -> None:
        self.handle, self.ready, self.started, self.up, self.in_flight = handle, ready, time.monotonic(), False, 0


class ActorPool:
    def __init__(self, ray: Any, dataset: Dataset, options: LoaderOptions, fields: FieldSpec | None) -> None:
        self.ray, self.size = ray, options.pool_workers_resolved
        self.needs = {"CPU": 1.0, **{k: float(v) for k, v in (options.pool_resources or ())}}
        self.actor = ray.remote(BatchActor).options(num_cpus=1, resources=dict(options.pool_resources or {}),
                                                    max_restarts=0, max_task_retries=0)
        self.args = (ray.put(dataset), options, fields)
        self.members: list[Member] = []
        self.replaced = self.reissued = 0  # actors started in place of lost ones; batches issued again
        self.last_error = ""
        self.refill()

    def refill(self) -> None:
        """Start members up to the pool's size, where the cluster can hold them; the replacement budget anew."""
        self.budget = 2 * self.size + 2
        if self.placeable():
            while len(self.members) < self.size:
                self.members.append(self._start())

    def _start(self) -> Member:
        handle = self.actor.remote(*self.args)
        return Member(handle, handle.ready.remote())

    def placeable(self) -> bool:
        """Whether some live node of the cluster has the resources one actor needs (in total: busy or not)."""
        for node in self.ray.nodes():
            have = node.get("Resources", {})
            if node.get("Alive") and all(have.get(k, 0.0) >= v for k, v in self.needs.items()):
                return True
        self.last_error = f"no live node of the Ray cluster has the resources {self.needs} one pool actor needs"
        return False

    def check(self) -> list[Member]:
        """The members found dead or unplaceable since the last check (removed from the pool already)."""
        gone = []
        pending = [m for m in self.members if not m.up]
        for m in pending:
            done, _ = self.ray.wait([m.ready], timeout=0)
            if done:
                try:
                    self.ray.get(m.ready)
                    m.up = True
                except Exception as exc:  # the actor died starting (its node lost, its __init__ raised)
                    gone.append(self._give_up(m, exc))
            elif time.monotonic() - m.started > START_S or not self.placeable():
                gone.append(self._give_up(m, None))
        if self.members and len(self.members) < self.size and self.budget > 0 and self.placeable():
            self.budget -= 1  # capacity is back (a node joined): the pool refills mid-epoch
            self.members.append(self._start())
        return gone

    def lost(self, member: Member, exc: BaseException) -> None:
        """`member` died under a lease (an error out of one of its calls): given up."""
        if member in self.members:
            self._give_up(member, exc)

    def _give_up(self, member: Member, exc: BaseException | None) -> Member:
        self.members.remove(member)
        if exc is not None:
            self.last_error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        elif not self.last_error:
            self.last_error = f"an actor was not up {START_S:.0f} s after it was asked for"
        log.warning("datapipe: a Ray pool actor was lost (%s); its batches are issued again", self.last_error)
        try:
            self.ray.kill(member.handle, no_restart=True)
        except Exception:  # already gone with its node
            pass
        if self.budget > 0 and self.placeable():
            self.budget -= 1
            self.replaced += 1
            self.members.append(self._start())
        return member

    def wait_up(self, timeout_s: float = START_S) -> int:
        """Wait until every member is up (or `timeout_s` passes), so that a benchmark's clock starts with
        the whole pool; the number of members that answered."""
        refs = [m.ready for m in self.members]
        done, _ = self.ray.wait(refs, num_returns=len(refs), timeout=timeout_s) if refs else ([], [])
        return len(done)

    def least_busy(self) -> Member | None:
        return min(self.members, key=lambda m: m.in_flight, default=None)

    def close(self) -> None:
        for m in self.members:
            try:
                self.ray.kill(m.handle, no_restart=True)
            except Exception:
                pass
        self.members = []
