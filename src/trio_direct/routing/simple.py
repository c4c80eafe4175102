"""Routing policies that look at nothing but the list of workers: round-robin and random (sans-IO).

The caller passes the current healthy workers on every call (`Fleet.workers()`), so a worker that
goes unhealthy simply stops being offered; the policies keep no per-worker state that could go stale.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Protocol, TypeVar

__all__ = ["NoWorkerAvailable", "RandomRouter", "RoundRobinRouter", "Router"]

T = TypeVar("T")


class NoWorkerAvailable(Exception):
    """There is no worker to route to (every engine of the needed role is down)."""


class Router(Protocol):
    """Picks one of the given workers for a request."""

    def choose(self, workers: Sequence[T]) -> T: ...


class RoundRobinRouter:
    """Each worker in turn.

    One counter, taken modulo the current list's length: fair over a fixed list, and still spreads
    requests evenly when the list changes between calls (no worker is skipped or favoured for long).
    """

    __slots__ = ("_counter",)

    def __init__(self) -> None:
        self._counter = 0

    def choose(self, workers: Sequence[T]) -> T:
        if not workers:
            raise NoWorkerAvailable("no healthy worker to route to")
        worker = workers[self._counter % len(workers)]
        self._counter += 1
        return worker


class RandomRouter:
    """A uniformly random worker; ``seed`` makes the sequence reproducible (tests, benchmarks)."""

    __slots__ = ("_random",)

    def __init__(self, seed: int | None = None) -> None:
        self._random = random.Random(seed)

    def choose(self, workers: Sequence[T]) -> T:
        if not workers:
            raise NoWorkerAvailable("no healthy worker to route to")
        return workers[self._random.randrange(len(workers))]
