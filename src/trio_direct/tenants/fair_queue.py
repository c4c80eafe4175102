"""A fair share of a full fleet: who waits in line next, tenant by tenant (sans-IO).

When every slot is taken, the waiters of all tenants form one line, and first come first served
gives a tenant that sends ten times more requests ten times more slots. `FairLine` shares the
slots by weight instead:

- the highest priority class first: a waiter of a tenant in a higher class goes before any of a
  lower class;
- within a class, the tenant holding the fewest slots for its weight (slots held / weight) goes
  next: under overload two tenants of weight 1 end up holding half the slots each, however many
  requests each sends, and weight 2 against weight 1 holds two thirds. Counting the slots held,
  not the turns taken, is what makes it a share of the fleet: a tenant whose requests run long
  holds its slots longer and is admitted less often, and a tenant that sends little is admitted at
  the next free slot rather than behind the flood's next turn;
- between tenants holding as much for their weight, start-time fair queueing (SFQ): each tenant's
  next turn carries a virtual start tag, ``max(the end of its last turn, the class's virtual
  time)`` when it starts waiting and the end of its last turn while it still has waiters, a turn
  lasting ``1 / weight``; the smallest tag goes (ties: the earliest arrival) and the class's
  virtual time becomes that tag. A tenant that had nobody waiting gets no credit for its idle
  time and pays no debt for its past;
- within a tenant, its own waiters go by their order key (request priority, then arrival).

A waiter may not be able to go even with a slot free (its pool's engines are all busy): `take`
then tries the tenant's next waiter, and moves on to the other tenants when none of its waiters can
go, so that a busy pool holds up only those who wait for it.

The owner says when a tenant takes a slot outside the line (`hold`: admitted at once on arrival)
and when any slot is given back (`release`).
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

__all__ = ["FairLine"]

Item = TypeVar("Item", bound=Hashable)
#: A waiter's place within its tenant's own line: request priority then arrival, the arrival last.
Order = tuple[int, int]
#: Past this many tenants known, idle ones are forgotten after a `take`.
_PRUNE_AT = 64


@dataclass(slots=True)
class _Flow(Generic[Item]):
    """One tenant's waiters and its place in the class's virtual time."""

    name: str
    priority: int
    weight: float
    #: The end of its last turn (its start tag + 1 / weight).
    finish: float = 0.0
    #: The start tag of its next turn: set when it starts waiting, and after each of its turns.
    tag: float = 0.0
    #: Slots it holds now.
    held: int = 0
    orders: list[Order] = field(default_factory=list)
    items: list[Item] = field(default_factory=list)


class FairLine(Generic[Item]):
    """The waiters of every tenant (see the module docstring). Items must be distinct objects."""

    def __init__(self) -> None:
        self._flows: dict[str, _Flow[Item]] = {}
        #: Per priority class: the start tag of the last admission, where an idle tenant starts again.
        self._virtual: dict[int, float] = {}
        self._where: dict[int, tuple[_Flow[Item], Order]] = {}

    def __len__(self) -> int:
        return len(self._where)

    def __iter__(self):
        for flow in self._flows.values():
            yield from flow.items

    def hold(self, tenant: str, *, priority: int = 0, weight: float = 1.0) -> None:
        """`tenant` took a slot without waiting in line."""
        flow = self._flows.get(tenant)
        if flow is None:
            flow = self._flows[tenant] = _Flow(tenant, priority, weight, self._virtual.get(priority, 0.0))
        flow.held += 1

    def release(self, tenant: str) -> None:
        """A slot `tenant` held (from `hold` or `take`) is free."""
        flow = self._flows.get(tenant)
        if flow is None:
            return
        flow.held -= 1
        if not flow.held and not flow.items and flow.finish <= self._virtual.get(flow.priority, 0.0):
            del self._flows[tenant]

    def last(self, tenant: str) -> Item | None:
        """`tenant`'s waiter that would go last (its lowest request priority, latest arrival)."""
        flow = self._flows.get(tenant)
        return flow.items[-1] if flow is not None and flow.items else None

    def held(self, tenant: str) -> int:
        flow = self._flows.get(tenant)
        return flow.held if flow is not None else 0

    def push(self, item: Item, tenant: str, order: Order, *, priority: int = 0, weight: float = 1.0) -> None:
        """`item` waits, for `tenant` of class `priority` and share `weight` (the latest values win)."""
        flow = self._flows.get(tenant)
        if flow is None:
            flow = self._flows[tenant] = _Flow(tenant, priority, weight, self._virtual.get(priority, 0.0))
        if not flow.items:  # it starts waiting: from the class's virtual time, no credit for idling
            flow.priority, flow.weight = priority, weight
            flow.tag = max(flow.finish, self._virtual.get(priority, 0.0))
        index = bisect.bisect(flow.orders, order)
        flow.orders.insert(index, order)
        flow.items.insert(index, item)
        self._where[id(item)] = (flow, order)

    def remove(self, item: Item) -> None:
        """`item` no longer waits (it left, or was taken)."""
        flow, order = self._where.pop(id(item))
        index = bisect.bisect_left(flow.orders, order)
        del flow.orders[index], flow.items[index]
        if not flow.items and not flow.held and flow.finish <= self._virtual.get(flow.priority, 0.0):
            del self._flows[flow.name]  # idle and owed nothing: it would start from the virtual time anyway

    def take(self, count: int, can_go: Callable[[Item], bool]) -> list[Item]:
        """Up to `count` waiters, in fair order, for which `can_go` is true; they leave the line.

        `can_go` is asked in the order the waiters would be served and may keep its own tally (a
        pool's headroom that each admission uses up). Each waiter taken holds a slot for its tenant
        until `release`.
        """
        taken: list[Item] = []
        if count <= 0 or not self._where:
            return taken
        heap = [self._entry(flow) for flow in self._flows.values() if flow.items]
        heapq.heapify(heap)
        while heap and len(taken) < count:
            _, _, tag, _, name = heapq.heappop(heap)
            flow = self._flows[name]
            item = next((candidate for candidate in flow.items if can_go(candidate)), None)
            if item is None:
                continue  # none of its waiters can go now: the others may
            flow.finish = tag + 1.0 / flow.weight
            if tag > self._virtual.get(flow.priority, 0.0):
                self._virtual[flow.priority] = tag
            flow.held += 1
            self.remove(item)
            taken.append(item)
            if flow.items:
                flow.tag = flow.finish
                heapq.heappush(heap, self._entry(flow))
        if len(self._flows) > _PRUNE_AT:
            self._prune()
        return taken

    def _prune(self) -> None:
        """Forget the tenants with nobody waiting whose last turn has ended in virtual time: they
        would start from the virtual time anyway (tenants named by tokens come and go)."""
        virtual = self._virtual
        for name in [
            n for n, f in self._flows.items() if not f.items and not f.held and f.finish <= virtual.get(f.priority, 0.0)
        ]:
            del self._flows[name]

    @staticmethod
    def _entry(flow: _Flow[Item]) -> tuple[int, float, float, int, str]:
        return (-flow.priority, flow.held / flow.weight, flow.tag, flow.orders[0][-1], flow.name)
