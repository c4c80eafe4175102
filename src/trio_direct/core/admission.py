"""Admission: how many generation requests are served at once, and who waits, in what order, how long.

`--max-concurrent-requests N` slots; past them, up to `--max-queued-requests M` requests wait for
at most `--queue-timeout S` seconds (then 503 with Retry-After); past M waiting, a request is
refused at once (429 with Retry-After). With M = 0 (the default) a request past N is refused at
once, as without a queue.

Who goes next is fair between tenants (`tenants.fair_queue.FairLine`): the tenant of the highest
priority class first, then within a class the tenant holding the fewest slots for its weight
(weighted fair queueing between equals), so that a tenant sending ten times more requests gets its
weight's share of the slots, not ten elevenths; each tenant's own waiters by their request's
`priority`, then by arrival. Without tenants every request is the same tenant's: highest
`priority` first, then arrival.

The room in the line is shared fairly too: with the line full, a request of a tenant that has fewer
requests queued for its weight than another takes the place of that tenant's last waiter, which is
answered 429 (`displaced`); otherwise it is refused at once (429).

A request is counted from its arrival, before its body is read (`arrive`), so that a flood of bodies
cannot overrun the limit; it takes its place in the line once its body is decoded and planned, when
its `priority` and its model are known (`AdmissionQueue.wait`), and it is dispatched only once it
holds a slot *and* its model's pool has an engine below `--engine-busy-threshold` (the pool's
`headroom`): when every engine is busy, requests wait here rather than pile onto the engines, and
with no queue they are refused. A request that arrived while a slot was free but finds every engine
busy gives its slot back and waits like the others.

Waiters are admitted when a request ends (`leave`) and when the pools' load changes (`pump`, called
on every load poll). A waiter whose pool is busy does not hold up those behind it that wait for
another pool. A client that leaves while it waits is taken out of the line (`leave`) with nothing
sent to an engine.

`AdmissionQueue` is the sans-IO bookkeeping; `Admission` is its trio shell (waiting, timeouts,
metrics).
"""

from __future__ import annotations

import itertools
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import trio

from trio_direct import metrics
from trio_direct.core import errors
from trio_direct.tenants.fair_queue import FairLine

__all__ = ["Admission", "AdmissionQueue", "Gate", "Ticket", "UNLIMITED"]

log = logging.getLogger(__name__)

#: What a gate without a busy threshold reports: room for any number of requests.
UNLIMITED = sys.maxsize

# Ticket states.
ADMITTED = "admitted"  #: holds a slot
RESERVED = "reserved"  #: counted against the queue, its body not planned yet
WAITING = "waiting"  #: in the line
LEFT = "left"  #: ended (served, refused, timed out or gone)
DISPLACED = "displaced"  #: its place in the line went to a tenant with fewer waiting (429)


class Gate(Protocol):
    """What a waiter waits for besides a slot: its pool's engines (`core.pool.ServingPool`)."""

    def headroom(self) -> int:
        """How many more requests the pool's engines take before every one is busy (0: all busy)."""


@dataclass(eq=False, slots=True)
class Ticket:
    """One generation request's place in admission, from its arrival to its end."""

    state: str
    priority: int = 0
    #: Arrival order, the tie-break within a priority.
    seq: int = 0
    gate: Gate | None = None
    #: Set by the shell: wakes the waiting task once the ticket is admitted.
    wake: Callable[[], None] | None = None
    #: When it started waiting in the line (`time.perf_counter()`), for the wait-time histogram.
    since: float = 0.0
    #: Its turn came (admitted past the gate): asking again returns at once.
    cleared: bool = False
    #: Its tenant (the fair share of the line): name, priority class and weight.
    tenant: str = ""
    tenant_priority: int = 0
    weight: float = 1.0
    #: Its tenant's metrics label (bounded: `tenants.access.MetricLabels`); "" for no per-tenant metrics.
    label: str = ""

    @property
    def order(self) -> tuple[int, int]:
        return (-self.priority, self.seq)


class AdmissionQueue:
    """Slots and the line of waiters (sans-IO). `max_active` 0: no limit; `max_queued` 0: no line."""

    def __init__(self, max_active: int, max_queued: int) -> None:
        self.max_active = max_active
        self.max_queued = max_queued
        self.active = 0
        #: Tickets counted against `max_queued`: reserved at arrival or waiting in the line.
        self.queued = 0
        #: The line: fair between tenants, each tenant's own by `Ticket.order`.
        self._line: FairLine[Ticket] = FairLine()
        #: Per tenant with tickets counted against `max_queued`: (how many, its weight).
        self._queued_by: dict[str, list[float]] = {}
        self._seq = itertools.count()

    @property
    def waiting(self) -> int:
        return len(self._line)

    def _slot_free(self) -> bool:
        return not self.max_active or self.active < self.max_active

    def arrive(self, tenant: str = "", tenant_priority: int = 0, weight: float = 1.0) -> Ticket | None:
        """A request of `tenant` arrived: admitted at once, reserved a place in the line, or refused (None)."""
        if self._slot_free() and not self.queued:
            state = ADMITTED
            self.active += 1
            self._line.hold(tenant, priority=tenant_priority, weight=weight)
        elif self.queued < self.max_queued or self._displace_for(tenant, weight):
            state = RESERVED
            self.queued += 1
            self._count(tenant, 1, weight)
        else:
            return None
        return Ticket(state, seq=next(self._seq), tenant=tenant, tenant_priority=tenant_priority, weight=weight)

    def _count(self, tenant: str, delta: int, weight: float = 1.0) -> None:
        entry = self._queued_by.get(tenant)
        if entry is None:
            entry = self._queued_by[tenant] = [0, weight]
        entry[0] += delta
        if entry[0] <= 0:
            del self._queued_by[tenant]

    def _displace_for(self, tenant: str, weight: float) -> bool:
        """The line is full: make room for `tenant` if another tenant has more queued for its
        weight than `tenant` would have with this request. That tenant's last waiter gives up its
        place (its request is answered 429), so that a tenant flooding the queue cannot keep the
        others out of it."""
        mine = (self._queued_by.get(tenant, (0, weight))[0] + 1) / weight
        heaviest, most = None, mine
        for name, (count, their_weight) in self._queued_by.items():
            if name != tenant and count / their_weight > most and self._line.last(name) is not None:
                heaviest, most = name, count / their_weight
        if heaviest is None:
            return False
        victim = self._line.last(heaviest)
        assert victim is not None
        self._line.remove(victim)
        victim.state = DISPLACED
        self.queued -= 1
        self._count(victim.tenant, -1)
        if victim.wake is not None:
            victim.wake()
        return True

    def wait(self, ticket: Ticket, priority: int, gate: Gate | None) -> bool:
        """The request is planned: True when it may be dispatched now; otherwise it is in the line
        (its `wake` is called once it is admitted). Raises `LookupError` when it would have to wait
        but the line is full (every engine busy and no room: refuse it)."""
        if ticket.cleared:
            return True
        ticket.priority, ticket.gate = priority, gate
        if ticket.state == ADMITTED:
            if gate is None or gate.headroom() > 0:
                ticket.cleared = True
                return True
            if self.queued >= self.max_queued:  # every engine busy and nowhere to wait
                raise LookupError("every engine is busy")
            self.active -= 1  # give the slot back: whoever it can serve may take it
            self._line.release(ticket.tenant)
            self.queued += 1
            self._count(ticket.tenant, 1, ticket.weight)
        elif ticket.state != RESERVED:
            raise RuntimeError(f"a ticket {ticket.state} cannot wait")
        ticket.state = WAITING
        self._line.push(ticket, ticket.tenant, ticket.order, priority=ticket.tenant_priority, weight=ticket.weight)
        self._admit_waiting()
        return ticket.state == ADMITTED

    def leave(self, ticket: Ticket) -> None:
        """The request ended, whatever its state: its slot or place goes to the next waiters."""
        state, ticket.state = ticket.state, LEFT
        if state == ADMITTED:
            self.active -= 1
            self._line.release(ticket.tenant)
        elif state == RESERVED:
            self.queued -= 1
            self._count(ticket.tenant, -1)
        elif state == WAITING:
            self._line.remove(ticket)
            self.queued -= 1
            self._count(ticket.tenant, -1)
        else:
            return
        self._admit_waiting()

    def pump(self) -> None:
        """The pools' load changed: admit whoever can go now."""
        self._admit_waiting()

    def _admit_waiting(self) -> None:
        """Admit waiters in fair order while slots are free, skipping those whose pool is busy."""
        if not self._line:
            return
        room: dict[int, int] = {}  # id(gate) -> headroom left in this pass

        def can_go(ticket: Ticket) -> bool:
            gate = ticket.gate
            if gate is None:
                return True
            left = room.get(id(gate))
            if left is None:
                left = gate.headroom()
            if left <= 0:
                room[id(gate)] = 0
                return False
            room[id(gate)] = left - 1
            return True

        free = self.max_active - self.active if self.max_active else len(self._line)
        for ticket in self._line.take(free, can_go):
            self.active += 1
            self.queued -= 1
            self._count(ticket.tenant, -1)
            ticket.state, ticket.cleared = ADMITTED, True
            if ticket.wake is not None:
                ticket.wake()


@dataclass(eq=False)
class Admission:
    """The trio shell of `AdmissionQueue`: the HTTP layer's `arrive` and `leave`, the core's `admit`."""

    max_active: int = 0
    max_queued: int = 0
    timeout: float = 30.0
    queue: AdmissionQueue = field(init=False)
    #: Pools whose load polls wake the line (each registers `pump` once).
    _watched: set[int] = field(init=False, default_factory=set)

    def __post_init__(self) -> None:
        self.queue = AdmissionQueue(self.max_active, self.max_queued)

    def arrive(self, tenant: str = "", tenant_priority: int = 0, weight: float = 1.0) -> Ticket | None:
        """At arrival, before the body is read: a ticket, or None to answer 429 at once."""
        ticket = self.queue.arrive(tenant, tenant_priority, weight)
        if ticket is None:
            metrics.ADMISSION_REJECTIONS.labels("limit").inc()
        else:
            metrics.QUEUE_DEPTH.set(self.queue.queued)
        return ticket

    def leave(self, ticket: Ticket) -> None:
        self.queue.leave(ticket)
        metrics.QUEUE_DEPTH.set(self.queue.queued)

    def pump(self) -> None:
        self.queue.pump()
        metrics.QUEUE_DEPTH.set(self.queue.queued)

    def watch(self, pool: object) -> None:
        """Have `pool`'s load polls wake the line (`on_load_change`, when the pool has one)."""
        if id(pool) not in self._watched:
            self._watched.add(id(pool))
            subscribe = getattr(pool, "on_load_change", None)
            if subscribe is not None:
                subscribe(self.pump)

    async def admit(self, ticket: Ticket, priority: int | None, gate: Gate | None) -> None:
        """Return once the request may be dispatched; raises `ApiError` 503 when it waited
        `timeout` seconds, 429 when every engine is busy and the line is full. A caller cancelled
        while waiting (its client left) is out of the line: its `leave` ends the ticket."""
        if gate is not None:
            self.watch(gate)
        queue = self.queue
        try:
            if queue.wait(ticket, priority or 0, gate):
                return  # the common case: nothing to wait for, nothing allocated
        except LookupError:
            metrics.ADMISSION_REJECTIONS.labels("busy").inc()
            raise errors.rate_limited("Every engine is busy; retry later.") from None
        event = trio.Event()
        ticket.wake = event.set  # in the line now; nothing ran since `wait` put it there
        ticket.since = time.perf_counter()
        metrics.QUEUE_DEPTH.set(queue.queued)
        with trio.move_on_after(self.timeout):
            await event.wait()
        waited = time.perf_counter() - ticket.since
        metrics.QUEUE_WAIT.observe(waited)
        if ticket.label:
            metrics.TENANT_QUEUE_WAIT.labels(ticket.label).observe(waited)
        if ticket.state == ADMITTED:
            return
        if ticket.state == DISPLACED:
            ticket.state = LEFT
            metrics.ADMISSION_REJECTIONS.labels("displaced").inc()
            raise errors.rate_limited(
                "The queue is full: this request gave its place to another tenant's; retry later."
            )
        self.leave(ticket)
        metrics.ADMISSION_REJECTIONS.labels("timeout").inc()
        log.info("request waited %gs in the admission queue; answered 503", self.timeout)
        raise errors.service_unavailable(f"The server is busy: the request waited {self.timeout:g}s for a slot.")
