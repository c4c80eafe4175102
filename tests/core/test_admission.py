"""Admission: slots, the line (priority, then arrival), its bound, its timeout, and busy engines."""

from __future__ import annotations

import pytest
import trio

from trio_direct.core.admission import ADMITTED, LEFT, Admission, AdmissionQueue, Ticket
from trio_direct.core.errors import ApiError


class Pool:
    """A gate: room for `room` more requests (0: every engine busy)."""

    def __init__(self, room: int = 1_000) -> None:
        self.room = room
        self.listeners: list = []

    def headroom(self) -> int:
        return self.room

    def on_load_change(self, listener) -> None:
        self.listeners.append(listener)


def placed(queue: AdmissionQueue | Admission) -> Ticket:
    """An arrival that must get a ticket (admitted, or a place in the line), not a refusal."""
    ticket = queue.arrive()
    assert ticket is not None
    return ticket


def test_without_a_queue_past_the_limit_is_refused_at_once():
    queue = AdmissionQueue(max_active=2, max_queued=0)
    first, second = placed(queue), placed(queue)
    assert first.state == second.state == ADMITTED
    assert queue.arrive() is None
    queue.leave(first)
    assert placed(queue).state == ADMITTED


def test_no_limit_admits_everyone():
    queue = AdmissionQueue(max_active=0, max_queued=0)
    assert all(placed(queue).state == ADMITTED for _ in range(1000))


def test_waiters_go_by_priority_then_arrival():
    queue = AdmissionQueue(max_active=1, max_queued=10)
    running = placed(queue)
    order = []
    tickets = {}
    for name, priority in [("low", 0), ("high", 5), ("low2", 0), ("mid", 2), ("high2", 5)]:
        ticket = tickets[name] = placed(queue)
        ticket.wake = lambda name=name: order.append(name)
        assert queue.wait(ticket, priority, None) is False
    assert queue.arrive() is not None  # 5 waiting of 10
    current = running
    for _ in range(5):
        queue.leave(current)
        current = tickets[order[-1]]
    assert order == ["high", "high2", "mid", "low", "low2"]


def test_the_line_is_bounded_and_a_waiter_that_leaves_frees_its_place():
    queue = AdmissionQueue(max_active=1, max_queued=2)
    running = placed(queue)
    a, b = placed(queue), placed(queue)
    assert queue.arrive() is None  # two waiting: the third is refused
    queue.wait(a, 0, None)
    queue.leave(a)  # its client left while it waited
    assert a.state == LEFT and queue.waiting == 0
    c = queue.arrive()
    assert c is not None
    woken = []
    b.wake, c.wake = (lambda: woken.append("b")), (lambda: woken.append("c"))
    queue.wait(b, 0, None)
    queue.wait(c, 0, None)
    queue.leave(running)
    assert woken == ["b"] and b.state == ADMITTED and queue.active == 1


def test_a_busy_pool_holds_its_waiters_without_holding_up_another_pools():
    queue = AdmissionQueue(max_active=10, max_queued=10)
    busy, free = Pool(0), Pool()
    first = placed(queue)
    with pytest.raises(LookupError):  # all busy and nowhere to wait: refused
        AdmissionQueue(max_active=10, max_queued=0).wait(placed(AdmissionQueue(10, 0)), 0, busy)
    assert queue.wait(first, 9, busy) is False  # admitted at arrival, but every engine is busy: it waits
    assert queue.active == 0 and queue.waiting == 1
    other = placed(queue)
    assert other.state != ADMITTED  # someone is waiting: newcomers queue behind
    assert queue.wait(other, 0, free) is True  # another pool with room goes past the busy one
    busy.room = 1
    queue.pump()  # a load poll: room again
    assert first.state == ADMITTED


def test_headroom_bounds_how_many_waiters_one_pass_admits():
    queue = AdmissionQueue(max_active=0, max_queued=10)
    pool = Pool(0)
    tickets = [placed(queue) for _ in range(4)]
    for ticket in tickets:
        queue.wait(ticket, 0, pool)
    pool.room = 2
    queue.pump()
    assert [t.state for t in tickets] == [ADMITTED, ADMITTED, "waiting", "waiting"]


async def test_a_waiter_times_out_with_503_and_leaves_the_line():
    admission = Admission(max_active=1, max_queued=1, timeout=0.05)
    running = placed(admission)
    waiter = placed(admission)
    with pytest.raises(ApiError) as caught:
        await admission.admit(waiter, None, None)
    assert caught.value.status == 503
    assert admission.queue.waiting == 0 and admission.queue.queued == 0
    admission.leave(running)
    assert admission.queue.active == 0


async def test_a_waiter_is_admitted_when_a_slot_frees_and_a_cancelled_one_leaves_the_line():
    admission = Admission(max_active=1, max_queued=2, timeout=10)
    running = placed(admission)
    patient, impatient = placed(admission), placed(admission)
    admitted = []

    async def wait(ticket) -> None:
        await admission.admit(ticket, None, None)
        admitted.append(ticket)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait, patient)
        with trio.move_on_after(0.05):  # a client that leaves while queued
            await admission.admit(impatient, None, None)
        admission.leave(impatient)
        assert admission.queue.waiting == 1
        admission.leave(running)
    assert admitted == [patient] and admission.queue.active == 1


async def test_engines_busy_without_a_queue_is_429_and_load_polls_wake_the_line():
    admission = Admission(max_active=0, max_queued=0)
    with pytest.raises(ApiError) as caught:
        await admission.admit(placed(admission), None, Pool(0))
    assert caught.value.status == 429
    admission = Admission(max_active=0, max_queued=5, timeout=10)
    pool = Pool(0)
    ticket = placed(admission)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(admission.admit, ticket, None, pool)
        await trio.sleep(0.01)
        assert admission.queue.waiting == 1 and len(pool.listeners) == 1
        pool.room = 1
        for listener in pool.listeners:
            listener()
    assert ticket.state == ADMITTED
