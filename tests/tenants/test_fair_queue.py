"""The admission line's fair share (`tenants.fair_queue` inside `core.admission`), proven on the sans-IO
queue with a simulated fleet: no clock, no server, every share counted exactly."""

from __future__ import annotations

import heapq
import random
from collections import Counter

import trio
import trio.testing

from trio_direct.core.admission import ADMITTED, DISPLACED, RESERVED, Admission, AdmissionQueue, Ticket
from trio_direct.core.errors import ApiError
from trio_direct.tenants.fair_queue import FairLine


def simulate(
    in_flight: dict[str, int],
    *,
    slots: int = 16,
    weights: dict[str, float] | None = None,
    classes: dict[str, int] | None = None,
    completions: int = 20_000,
    seed: int = 7,
) -> Counter:
    """Each tenant keeps `in_flight[name]` requests outstanding (a new one arrives as one ends);
    each served request takes a random service time. Returns the completions per tenant."""
    weights = weights or {}
    classes = classes or {}
    rng = random.Random(seed)
    queue = AdmissionQueue(max_active=slots, max_queued=10_000)
    now = 0.0
    running: list[tuple[float, int, Ticket]] = []  # (ends at, tie, ticket)
    tie = 0
    done: Counter = Counter()

    def start(ticket: Ticket) -> None:
        nonlocal tie
        tie += 1
        heapq.heappush(running, (now + rng.uniform(0.5, 1.5), tie, ticket))

    def send(tenant: str) -> None:
        ticket = queue.arrive(tenant, classes.get(tenant, 0), weights.get(tenant, 1.0))
        assert ticket is not None
        ticket.wake = lambda: start(ticket)
        if queue.wait(ticket, 0, None):
            start(ticket)

    for tenant, count in in_flight.items():
        for _ in range(count):
            send(tenant)
    while sum(done.values()) < completions:
        now, _, ticket = heapq.heappop(running)
        assert ticket.state == ADMITTED
        done[ticket.tenant] += 1
        queue.leave(ticket)  # admits the next waiter (its wake starts it)
        send(ticket.tenant)
    assert queue.active == slots
    return done


def share(done: Counter, tenant: str) -> float:
    return done[tenant] / sum(done.values())


def test_a_tenant_sending_ten_times_more_gets_half_the_slots_not_ten_elevenths():
    done = simulate({"steady": 9, "flood": 90})
    assert 0.45 <= share(done, "steady") <= 0.5  # 9 in flight of 16 slots: never more than it asks


def test_without_tenants_the_line_is_first_come_first_served_and_the_flood_wins():
    # The same load as one tenant: what the line did before it was fair (the baseline of the test above).
    done = simulate({"": 99})
    assert done[""] == 20_000
    line: FairLine[object] = FairLine()
    items = [object() for _ in range(5)]
    for seq, item in enumerate(items):
        line.push(item, "", (0, seq))
    assert line.take(5, lambda _: True) == items


def test_weights_share_the_slots_in_proportion():
    done = simulate({"gold": 90, "silver": 90}, weights={"gold": 2, "silver": 1})
    assert abs(share(done, "gold") - 2 / 3) < 0.02
    done = simulate({"a": 90, "b": 90, "c": 90})
    assert all(abs(share(done, name) - 1 / 3) < 0.02 for name in "abc")


def test_a_higher_priority_class_goes_first_and_a_lower_one_gets_what_is_left():
    line: FairLine[str] = FairLine()
    for seq in range(3):
        line.push(f"batch{seq}", "batch", (0, seq), weight=100)
    line.push("interactive", "interactive", (0, 9), priority=1)
    assert line.take(2, lambda _: True) == ["interactive", "batch0"]  # first, whatever the weights
    # Under load, interactive is first in line each time it has a waiter: more than its fair half
    # of the completions (its next request arrives only after its last freed its slot to batch).
    shared = simulate({"batch": 90, "interactive": 10})
    first = simulate({"batch": 90, "interactive": 10}, classes={"interactive": 1})
    assert share(shared, "interactive") <= 0.51 < 0.55 < share(first, "interactive") <= 10 / 16


def serve_one_at_a_time(line: FairLine, tenant_of: dict, turns: int) -> list:
    """`turns` admissions, each slot given back before the next (so every tenant holds none)."""
    order = []
    for _ in range(turns):
        (item,) = line.take(1, lambda _: True)
        line.release(tenant_of[item])
        order.append(item)
    return order


def test_a_tenant_back_from_idle_gets_no_credit_for_its_idle_time():
    line: FairLine[object] = FairLine()
    flood = [object() for _ in range(100)]
    tenant_of = {item: "flood" for item in flood}
    for seq, item in enumerate(flood):
        line.push(item, "flood", (0, seq))
    assert serve_one_at_a_time(line, tenant_of, 50) == flood[:50]  # alone: it takes every turn
    late = [object() for _ in range(10)]
    tenant_of.update({item: "late" for item in late})
    for seq, item in enumerate(late, start=100):
        line.push(item, "late", (0, seq))
    # the late tenant goes next, then they alternate: it does not get 50 turns in a row for the ones it missed
    order = serve_one_at_a_time(line, tenant_of, 20)
    assert order == [x for pair in zip(late, flood[50:60]) for x in pair]


def test_the_tenant_holding_fewer_slots_goes_at_the_next_free_one():
    line: FairLine[str] = FairLine()
    for _ in range(8):
        line.hold("flood")
    for _ in range(7):
        line.hold("steady")
    for seq in range(50):
        line.push(f"flood{seq}", "flood", (0, seq))
    line.push("steady", "steady", (0, 50))  # arrived last, behind 50 of the flood's
    assert line.take(1, lambda _: True) == ["steady"]
    line.release("flood")
    assert line.take(1, lambda _: True) == ["flood0"]
    assert (line.held("steady"), line.held("flood")) == (8, 8)


def test_within_a_tenant_request_priority_then_arrival():
    line: FairLine[str] = FairLine()
    line.push("low-early", "t", (0, 1))
    line.push("high-late", "t", (-5, 2))
    line.push("low-late", "t", (0, 3))
    assert line.take(3, lambda _: True) == ["high-late", "low-early", "low-late"]


def test_a_waiter_whose_pool_is_busy_holds_up_neither_its_tenant_nor_the_others():
    line: FairLine[str] = FairLine()
    line.push("a-busy-pool", "a", (0, 1))
    line.push("a-free-pool", "a", (0, 2))
    line.push("b-busy-pool", "b", (0, 3))
    line.push("b-free-pool", "b", (0, 4))
    assert line.take(4, lambda item: "free" in item) == ["a-free-pool", "b-free-pool"]
    assert len(line) == 2 and sorted(line) == ["a-busy-pool", "b-busy-pool"]


def test_a_waiter_that_leaves_is_out_of_the_line_and_idle_tenants_are_forgotten():
    line: FairLine[str] = FairLine()
    line.push("x", "gone", (0, 1))
    line.remove("x")
    assert len(line) == 0 and not line._flows
    for seq in range(1000):
        line.push(f"r{seq}", f"tenant-{seq}", (0, seq))
    assert len(line.take(1000, lambda _: True)) == 1000
    for seq in range(1000):
        line.release(f"tenant-{seq}")
    for seq in range(3):  # the line moves on
        line.push(f"x{seq}", "x", (0, 2000 + seq))
    assert serve_one_at_a_time(line, {f"x{seq}": "x" for seq in range(3)}, 3) == ["x0", "x1", "x2"]
    assert len(line._flows) <= 1  # a thousand token-named tenants leave nothing behind


def test_a_full_queue_makes_room_for_a_tenant_with_fewer_waiting_at_the_floods_expense():
    queue = AdmissionQueue(max_active=2, max_queued=4)
    first, second = queue.arrive("flood"), queue.arrive("flood")
    assert first is not None and second is not None
    running = [first, second]
    assert all(ticket.state == ADMITTED for ticket in running)
    woken: list[Ticket] = []
    flood = []
    for _ in range(4):
        ticket = queue.arrive("flood")
        assert ticket is not None
        ticket.wake = lambda ticket=ticket: woken.append(ticket)
        assert not queue.wait(ticket, 0, None)
        flood.append(ticket)
    assert queue.arrive("flood") is None  # full, and the flood has the most waiting: refused at once
    steady = queue.arrive("steady")
    assert steady is not None and steady.state == RESERVED  # in, in place of the flood's last
    assert woken == [flood[-1]] and flood[-1].state == DISPLACED
    second = queue.arrive("steady")
    assert second is not None and woken == [flood[-1], flood[-2]]  # steady 2 vs flood 2: still room
    assert queue.arrive("steady") is None  # steady 3 against flood 2: it would be the heavier one
    assert queue.queued == 4
    queue.leave(flood[-1])  # a displaced request's end frees nothing more
    assert queue.queued == 4 and queue.active == 2
    assert not queue.wait(steady, 0, None)
    queue.leave(running[0])
    assert steady.state == ADMITTED  # the steady tenant holds fewer slots: it goes first


async def test_a_displaced_request_is_answered_429():
    admission = Admission(max_active=1, max_queued=2, timeout=30)
    running = admission.arrive("flood")
    first, second = admission.arrive("flood"), admission.arrive("flood")
    assert running is not None and first is not None and second is not None
    waiting = [first, second]
    outcome: dict = {}

    async def wait(ticket) -> None:
        try:
            await admission.admit(ticket, None, None)
            outcome[ticket.seq] = 200
        except ApiError as error:
            outcome[ticket.seq] = error.status

    async with trio.open_nursery() as nursery:
        for ticket in waiting:
            nursery.start_soon(wait, ticket)
            await trio.testing.wait_all_tasks_blocked()
        assert admission.arrive("steady") is not None
        await trio.testing.wait_all_tasks_blocked()
        assert outcome == {waiting[1].seq: 429}  # the flood's last waiter
        admission.leave(waiting[1])
        admission.leave(running)
    assert outcome == {waiting[1].seq: 429, waiting[0].seq: 200}
