"""The counters tenant limits are kept in: a protocol, and the in-process implementation.

The limiter (`tenants.limiter`) asks for two things, by key:

- a fixed window (``add_to_window``): add an amount to the current window of ``window_s`` seconds
  and learn the window's total and how long until it resets (requests and tokens per minute);
- slots with leases (``acquire_slot`` / ``release_slot``): at most ``limit`` holders at once, each
  holding for at most ``lease_s`` seconds unless it renews (acquires again under its name), so a
  frontend that dies holding slots does not hold them forever (concurrent requests).

`LocalCounters` keeps them in this process: with several ``--workers`` or replicas each process
counts on its own, and a tenant gets its limits once per process. A shared state store (Redis,
PostgreSQL) that implements the same three methods makes them hold across every frontend; the
limiter takes either unchanged. A method may answer at once or be a coroutine (a shared store
answers over the network): the limiter awaits what is awaitable (`answer`).
"""

from __future__ import annotations

import inspect
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

__all__ = ["Counters", "LocalCounters", "answer"]

T = TypeVar("T")


async def answer(value: T | Awaitable[T]) -> T:
    """A counters method's answer, awaited when it is a coroutine."""
    if inspect.isawaitable(value):
        return await value
    return value


class Counters(Protocol):
    """Windows and leased slots shared by everything that enforces the same limits."""

    def add_to_window(self, key: str, amount: int, window_s: float) -> tuple[int, float] | Awaitable[tuple[int, float]]:
        """Add `amount` to `key`'s current fixed window of `window_s` seconds: (the window's total
        after the add, seconds until the window resets)."""
        ...

    def acquire_slot(
        self, key: str, holder: str, limit: int, lease_s: float
    ) -> tuple[bool, int] | Awaitable[tuple[bool, int]]:
        """Take (or renew) `holder`'s slot of `key` if fewer than `limit` are held: (acquired, the
        number held now). A slot not renewed within `lease_s` seconds is freed."""
        ...

    def release_slot(self, key: str, holder: str) -> Awaitable[None] | None:
        """Free `holder`'s slot of `key` (nothing if it holds none)."""
        ...


@dataclass(slots=True)
class _Window:
    start: float
    total: int = 0


@dataclass(slots=True)
class _Slots:
    #: holder -> lease expiry
    leases: dict[str, float] = field(default_factory=dict)


#: Past this many windows, expired ones are dropped on the next add (tenants named by tokens come and go).
_PRUNE_AT = 4096


class LocalCounters:
    """`Counters` in this process's memory: per process, not shared (see the module docstring).

    Windows are aligned on the wall clock (a window of 60 s starts on the minute), as a shared
    store's would be, so that the reset every response announces is the same for every request.
    """

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._windows: dict[str, _Window] = {}
        self._slots: dict[str, _Slots] = {}

    def add_to_window(self, key: str, amount: int, window_s: float) -> tuple[int, float]:
        now = self._clock()
        start = math.floor(now / window_s) * window_s
        window = self._windows.get(key)
        if window is None or window.start != start:
            if window is None and len(self._windows) >= _PRUNE_AT:
                self._prune(now, window_s)
            window = self._windows[key] = _Window(start)
        window.total += amount
        return window.total, max(0.0, start + window_s - now)

    def _prune(self, now: float, window_s: float) -> None:
        for key in [key for key, window in self._windows.items() if window.start + window_s <= now]:
            del self._windows[key]

    def acquire_slot(self, key: str, holder: str, limit: int, lease_s: float) -> tuple[bool, int]:
        now = self._clock()
        slots = self._slots.setdefault(key, _Slots())
        leases = slots.leases
        for expired in [name for name, until in leases.items() if until <= now]:
            del leases[expired]
        if holder in leases or len(leases) < limit:
            leases[holder] = now + lease_s
            return True, len(leases)
        return False, len(leases)

    def release_slot(self, key: str, holder: str) -> None:
        slots = self._slots.get(key)
        if slots is None:
            return
        slots.leases.pop(holder, None)
        if not slots.leases:
            del self._slots[key]

    def held(self, key: str) -> int:
        slots = self._slots.get(key)
        return len(slots.leases) if slots is not None else 0
