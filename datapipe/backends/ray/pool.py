"""The pool: N BatchActors (`pool_workers`), each placed with `pool_resources` (a Ray custom resource
keeps them to CPU-only nodes), one CPU each. A member that died (its node was lost, it was killed) or
cannot be placed (no node of the cluster holds its resources, or it is not up START_S after it was
asked for) is given up and started afresh in its place, a bounded number of times per epoch; the
loader re-issues the member's leased batches to the others. A member still waiting START_S for room
that other actors or tasks hold (the cluster is full) is given up and not replaced: the pool says so
once, naming what holds the room, and carries on with the members it has (none: the loader falls
back); the next iteration starts it again only where the cluster has room then. With
pool_workers="auto" the loader grows the pool where the cluster has room (else asks Ray's autoscaler
for it) and shrinks it: a member that goes takes no new lease and is stopped once its leased batches
are received. A pool released (the end
of a non-persistent loader's iteration) holds no actor until it is refilled."""
from __future__ import annotations

import logging
import time
from collections import Counter
from typing import Any

from ...errors import shortened
from ...formats.base import Dataset
from ...pool_sizing import capacity
from ..fields import FieldSpec
from ..options import LoaderOptions
from .actor import BatchActor

log = logging.getLogger(__name__)
START_S = 60.0  # an actor that a node could hold but is not up by then is given up (a node starting is seconds)
WAITING = ("DEPENDENCIES_UNREADY", "PENDING_CREATION")  # Ray's states of an actor not yet up


class Member:
    """One actor of the pool: its handle, the answer to its `ready` call, when it was asked for, and
    the leases in flight on it."""

    def __init__(self, handle: Any, ready: Any) -> None:
        self.handle, self.ready, self.started, self.up, self.in_flight = handle, ready, time.monotonic(), False, 0


class ActorPool:
    def __init__(self, ray: Any, dataset: Dataset, options: LoaderOptions, fields: FieldSpec | None) -> None:
        self.ray, self.size = ray, options.pool_workers_resolved
        self.size_history = [(0, self.size)]  # (batches received, pool size) at each change (bench, doctor)
        self.needs = {"CPU": 1.0, **{k: float(v) for k, v in (options.pool_resources or ())}}
        self.actor = ray.remote(BatchActor).options(num_cpus=1, resources=dict(options.pool_resources or {}),
                                                    max_restarts=0, max_task_retries=0)
        self.args = (ray.put(dataset), options, fields)
        self.members: list[Member] = []
        self.leaving: list[Member] = []  # members taken out of the pool, stopped once their leases are received
        self.replaced = self.reissued = 0  # actors started in place of lost ones; batches issued again
        self.requested = 0  # actors' worth of resources asked of the autoscaler (0: nothing asked)
        self.budget, self.last_error = 0, ""
        self.full = False  # a member waited START_S for room others hold: none is started until there is room
        if options.persistent_workers:
            self.refill()

    def refill(self) -> None:
        """A new iteration: leases of one broken off are not waited for (members leaving are stopped);
        members started up to the pool's size, where the cluster can hold them; the replacement budget anew."""
        self.budget = 2 * self.size + 2
        for m in self.members:
            m.in_flight = 0
        self._stop(self.leaving)
        self.leaving = []
        if self.placeable() and (not self.full or self.room()):
            self.full = False
            while len(self.members) < self.size:
                self.members.append(self._start())

    def _start(self) -> Member:
        handle = self.actor.remote(*self.args)
        return Member(handle, handle.ready.remote())

    def placeable(self) -> bool:
        """Whether some live node of the cluster has the resources one actor needs (in total: busy or not)."""
        if capacity(self.ray.nodes(), self.needs) > 0:
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
            elif not self.placeable():
                gone.append(self._give_up(m, None))
            elif time.monotonic() - m.started > START_S:
                gone.append(self._full(m) if self._waiting_for_room(m) else self._give_up(m, None))
        if (self.members and len(self.members) < self.size and self.budget > 0 and self.placeable()
                and (not self.full or self.room())):
            self.budget -= 1  # capacity is back (a node joined): the pool refills mid-epoch
            self.members.append(self._start())
        return gone

    def lost(self, member: Member, exc: BaseException) -> None:
        """`member` died under a lease (an error out of one of its calls): given up."""
        if member in self.members:
            self._give_up(member, exc)
        elif member in self.leaving:  # it was going anyway: its leases are issued again, nothing replaces it
            self.leaving.remove(member)

    def _give_up(self, member: Member, exc: BaseException | None) -> Member:
        self.members.remove(member)
        if exc is not None:
            self.last_error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        elif not self.last_error:
            self.last_error = f"an actor was not up {START_S:.0f} s after it was asked for"
        log.warning("datapipe: a Ray pool actor was lost (%s); its batches are issued again", self.last_error)
        self._stop([member])
        if self.budget > 0 and self.placeable():
            self.budget -= 1
            self.replaced += 1
            self.members.append(self._start())
        return member

    def _full(self, member: Member) -> Member:
        """`member` waited START_S for room that the cluster's other work holds: given up and not replaced
        (another would wait the same), said once; the members up carry on."""
        self.members.remove(member)
        self._stop([member])
        if not self.full:
            self.full = True
            self.last_error = (f"the Ray cluster is full: no node had {self.needs} free for a pool actor in "
                               f"{START_S:.0f} s, {self._holders()}; close the other loader, lower pool_workers, or "
                               "add nodes")
            if any(m.up for m in self.members):  # else the loader's fallback says it (the others wait the same)
                log.warning("datapipe: %s; the pool carries on with %d actors", self.last_error, len(self.members))
        return member

    def _waiting_for_room(self, member: Member) -> bool:
        """Whether `member` still waits for a node's resources (no worker process runs it yet: Ray's actor
        table), as opposed to starting slowly; without the table, whether the cluster lacks room for it."""
        try:
            from ray._private import state
            info = state.actors(member.handle._actor_id.hex())
            return info.get("State") in WAITING and not info.get("Pid")
        except Exception:  # Ray's private table gone
            return not self.room()

    def _holders(self) -> str:
        """What holds the cluster's room, in words: the live actors not of this pool, by class."""
        try:
            from ray._private import state
            alive = state.actors(actor_state_name="ALIVE")
        except Exception:
            return "held by other actors or tasks"
        mine = {m.handle._actor_id.hex() for m in self.members + self.leaving}
        names = Counter(str(a.get("ActorClassName", "?")) for key, a in alive.items() if key not in mine)
        if not names:
            return "held by tasks"
        listed = ", ".join(f"{n} {shortened(name, 40)}" for name, n in names.most_common(3))
        other = " (another backend='ray' loader still open?)" if BatchActor.__name__ in names else ""
        return f"held by actors not of this pool: {listed}{other}"

    def room(self) -> bool:
        """Whether the cluster has one actor's resources free now."""
        free = self.ray.available_resources()
        return all(free.get(k, 0.0) >= v for k, v in self.needs.items())

    def grow(self, at: int) -> bool:
        """One actor more where the cluster has one's resources free now (and holds more than the pool);
        else the autoscaler is asked for room for size + 1 (a hint: nothing happens on a fixed cluster).
        Nothing while a member is still starting: its wait is not the pool's size."""
        if any(not m.up for m in self.members):
            return False
        if len(self.members) < capacity(self.ray.nodes(), self.needs) and self.room():
            self.size = len(self.members) + 1
            self.members.append(self._start())
            self.size_history.append((at, self.size))
            return True
        self.request(self.size + 1)
        return False

    def shrink(self, at: int) -> None:
        """One actor fewer: the least busy member takes no new lease and is stopped once its leases are in."""
        member = self.least_busy()
        if member is None or len(self.members) < 2:
            return
        self.members.remove(member)
        self.leaving.append(member)
        self.size = len(self.members)
        self.size_history.append((at, self.size))
        if self.requested:
            self.request(self.size)
        self.settle()

    def settle(self) -> None:
        """Stop the members leaving whose leased batches are all received."""
        done = [m for m in self.leaving if m.in_flight <= 0]
        self._stop(done)
        self.leaving = [m for m in self.leaving if m not in done]

    def request(self, actors: int) -> None:
        """Ask Ray's autoscaler for `actors` actors' resources in all (0: withdraw the request). It
        overrides this cluster's previous request; without an autoscaler it is stored and unused."""
        if actors == self.requested or not self.ray.is_initialized():
            return
        try:
            from ray.autoscaler.sdk import request_resources
            request_resources(bundles=[dict(self.needs)] * actors)
            self.requested = actors
        except Exception as exc:  # a hint: the pool works without it
            log.debug("datapipe: request_resources failed: %s", exc)

    def wait_up(self, timeout_s: float = START_S) -> int:
        """Wait until every member is up (or `timeout_s` passes), so that a benchmark's clock starts with
        the whole pool; the number of members that answered."""
        refs = [m.ready for m in self.members]
        done, _ = self.ray.wait(refs, num_returns=len(refs), timeout=timeout_s) if refs else ([], [])
        return len(done)

    def least_busy(self) -> Member | None:
        return min(self.members, key=lambda m: m.in_flight, default=None)

    def release(self) -> None:
        """Stop every actor (their CPUs go back to the cluster); refill() starts them again."""
        self._stop(self.members + self.leaving)
        self.members, self.leaving = [], []

    def close(self) -> None:
        self.release()
        if self.requested:
            self.request(0)

    def _stop(self, members: list[Member]) -> None:
        for m in members:
            try:
                self.ray.kill(m.handle, no_restart=True)
            except Exception:  # already gone with its node
                pass
