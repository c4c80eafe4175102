"""Busy engines (``--engine-busy-threshold``): which workers take no new requests, and how many more
a pool can take before every worker is busy (sans-IO).

A worker is busy when its running + waiting requests reach the request threshold, or its KV usage
reaches the KV-usage threshold. Requests are the larger of what the engine last reported
(``GetLoad``: every frontend's requests as of the poll) and what this frontend has routed to it
and not seen end (fresh at dispatch time, between polls); KV usage is the engine's ``token_usage``.

Routing offers only the workers that are not busy while any is not (`prefer_idle`); admission holds
new requests while a pool has no room (`headroom` 0: every worker busy) instead of piling them onto
the engines. A worker not polled yet counts by this frontend's own requests only.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

__all__ = ["BusyThreshold", "EngineLoads"]

W = TypeVar("W")
Key = Hashable

#: No limit: what a worker below a KV-usage-only threshold has room for.
UNLIMITED = sys.maxsize


@dataclass(frozen=True, slots=True)
class BusyThreshold:
    """When a worker is busy: at `requests` running + waiting requests, or at `kv_usage` KV use."""

    requests: int | None = None
    kv_usage: float | None = None

    @classmethod
    def parse(cls, text: str) -> BusyThreshold | None:
        """``64`` (requests), ``0.9`` or ``90%`` (KV usage), or both comma-separated; "" = off.

        A value with a decimal point or a ``%`` is a KV-usage fraction, an integer a request count.
        Raises ValueError for anything else.
        """
        requests: int | None = None
        kv_usage: float | None = None
        for part in text.replace(" ", "").split(","):
            if not part:
                continue
            if part.endswith("%") or "." in part:
                value = float(part.rstrip("%")) / (100 if part.endswith("%") else 1)
                if not 0 < value <= 1:
                    raise ValueError(f"a KV usage threshold is a fraction in (0, 1], got {part!r}")
                kv_usage = value
            else:
                count = int(part)
                if count < 1:
                    raise ValueError(f"a request threshold is at least 1, got {part!r}")
                requests = count
        if requests is None and kv_usage is None:
            return None
        return cls(requests, kv_usage)

    def describe(self) -> str:
        parts = []
        if self.requests is not None:
            parts.append(f"{self.requests} running + waiting requests")
        if self.kv_usage is not None:
            parts.append(f"{self.kv_usage:.0%} KV usage")
        return " or ".join(parts)


@dataclass(slots=True)
class _Polled:
    requests: int
    kv_usage: float | None


class EngineLoads:
    """Per worker: the last polled load and this frontend's own requests, against a threshold."""

    __slots__ = ("threshold", "_polled", "_own", "_routes", "listeners")

    def __init__(self, threshold: BusyThreshold) -> None:
        self.threshold = threshold
        self._polled: dict[Key, _Polled] = {}
        self._own: dict[Key, int] = {}
        #: request id -> the workers it counts on: (decode or aggregated, prefill or None)
        self._routes: dict[str, list[Key]] = {}
        #: Called after every poll that was applied (admission re-checks its waiters).
        self.listeners: list[Callable[[], None]] = []

    # ---- what the engines report ----------------------------------------------------------------

    def apply_poll(self, key: Key, load: Mapping[str, Any]) -> None:
        """One rank's ``GetLoad`` entry (SGLang's keys; SMG's ``GetLoads`` uses the same names)."""
        requests = int(load.get("num_running_reqs") or 0) + int(load.get("num_waiting_reqs") or 0)
        usage = load.get("token_usage")
        self._polled[key] = _Polled(requests, float(usage) if isinstance(usage, (int, float)) else None)

    def polled(self) -> None:
        """A round of polls ended: tell whoever waits for room."""
        for listener in list(self.listeners):
            listener()

    def forget(self, key: Key) -> None:
        """The worker is gone or restarted: its poll no longer says anything."""
        self._polled.pop(key, None)

    # ---- this frontend's requests -------------------------------------------------------------

    def routed(self, request_id: str, keys: Iterable[Key]) -> None:
        """`request_id` was routed to `keys` (its engine, and its prefill engine first if any)."""
        counted = list(keys)
        if request_id in self._routes:
            self.released(request_id)
        self._routes[request_id] = counted
        own = self._own
        for key in counted:
            own[key] = own.get(key, 0) + 1

    def first_token(self, request_id: str) -> None:
        """The request's prefill is done: it no longer loads its prefill engine."""
        keys = self._routes.get(request_id)
        if keys is not None and len(keys) > 1:
            self._drop(keys.pop(0))

    def released(self, request_id: str) -> None:
        for key in self._routes.pop(request_id, ()):
            self._drop(key)

    def _drop(self, key: Key) -> None:
        left = self._own.get(key, 0) - 1
        if left > 0:
            self._own[key] = left
        else:
            self._own.pop(key, None)

    # ---- decisions ------------------------------------------------------------------------------

    def requests(self, key: Key) -> int:
        """Running + waiting requests of the worker: the larger of the poll and our own count."""
        polled = self._polled.get(key)
        own = self._own.get(key, 0)
        return own if polled is None else max(own, polled.requests)

    def room(self, key: Key) -> int:
        """How many more requests the worker takes before it is busy (0: busy)."""
        threshold = self.threshold
        if threshold.kv_usage is not None:
            polled = self._polled.get(key)
            if polled is not None and polled.kv_usage is not None and polled.kv_usage >= threshold.kv_usage:
                return 0
        if threshold.requests is None:
            return UNLIMITED
        return max(threshold.requests - self.requests(key), 0)

    def busy(self, key: Key) -> bool:
        return self.room(key) == 0

    def prefer_idle(self, workers: Sequence[W], key: Callable[[W], Key]) -> Sequence[W]:
        """The workers that are not busy, or all of them when every one is."""
        idle = [worker for worker in workers if self.room(key(worker)) > 0]
        return idle if idle and len(idle) < len(workers) else workers

    def headroom(self, workers: Sequence[W], key: Callable[[W], Key]) -> int:
        """Requests these workers take before all are busy (UNLIMITED when none is limited by count)."""
        total = 0
        for worker in workers:
            room = self.room(key(worker))
            if room == UNLIMITED:
                return UNLIMITED
            total += room
        return total

    def stats(self) -> dict[str, Any]:
        keys = set(self._polled) | set(self._own)
        return {
            "threshold": self.threshold.describe(),
            "workers": {str(k): {"requests": self.requests(k), "busy": self.busy(k)} for k in keys},
        }
