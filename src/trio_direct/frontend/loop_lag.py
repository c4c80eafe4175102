"""Event-loop lag: how late the frontend's trio loop wakes a short timer.

Every stream shares one event loop, so anything that holds it (a long synchronous computation, a
blocking call, a huge batch of ready tasks) delays every token of every stream. A task that sleeps
`interval` seconds in a loop and measures how late it woke sees that directly: the lag of one wake-up
is the time a ready task waited for the loop. A stall of S seconds shows as a lag between S minus
`interval` and S. The figures go to `/metrics`; a stall over `warn_after` is logged (at most one line
per `warn_every`, counting the ones it did not log).

Overhead: one wake-up per `interval` (50 per second at 20 ms) and one histogram observation each,
while requests are in flight. With none in flight nobody waits for the loop, and those wake-ups were
most of what an idle frontend costs (each runs with cold caches: ~0.25 ms, 1.3 % of a core at 50 per
second): the timer then runs every `idle_interval`. A stall that covers one of those wake-ups is
still measured in full; the monitor is back to `interval` within `idle_interval` of the first request.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass

import trio

from trio_direct import metrics

log = logging.getLogger(__name__)


@dataclass(slots=True)
class StallWarning:
    """A stall worth logging, with the stalls over the threshold that were not logged before it."""

    lag: float
    unlogged: int


@dataclass(slots=True)
class LagTracker:
    """The sans-IO part: the worst lag so far, and whether a lag is a stall to warn about now."""

    warn_after: float = 0.25
    warn_every: float = 10.0
    samples: int = 0
    worst: float = 0.0
    _last_warning: float = -math.inf
    _unlogged: int = 0

    def observe(self, lag: float, now: float) -> StallWarning | None:
        """Record one wake-up `lag` seconds late at time `now`; a warning when it should be logged."""
        lag = max(0.0, lag)
        self.samples += 1
        self.worst = max(self.worst, lag)
        if lag <= self.warn_after:
            return None
        if now - self._last_warning < self.warn_every:
            self._unlogged += 1
            return None
        warning = StallWarning(lag, self._unlogged)
        self._last_warning, self._unlogged = now, 0
        return warning


def _requests_in_flight() -> bool:
    return metrics.requests_in_flight() > 0


async def monitor_loop_lag(
    interval: float = 0.02,
    *,
    idle_interval: float = 0.5,
    busy: Callable[[], bool] = _requests_in_flight,
    tracker: LagTracker | None = None,
    task_status: trio.TaskStatus[LagTracker] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Measure the loop's lag every `interval` seconds while `busy()` (default: completion requests
    are in flight), every `idle_interval` otherwise, until cancelled (reports the tracker)."""
    tracker = LagTracker() if tracker is None else tracker
    task_status.started(tracker)
    while True:
        deadline = trio.current_time() + (interval if busy() else idle_interval)
        await trio.sleep_until(deadline)
        now = trio.current_time()
        lag = now - deadline
        worst = tracker.worst
        warning = tracker.observe(lag, now)
        metrics.LOOP_LAG.observe(max(0.0, lag))
        if tracker.worst > worst:
            metrics.LOOP_LAG_MAX.set(tracker.worst)
        if warning is not None:
            log.warning(
                "event loop stalled %.0f ms (every stream waited)%s",
                warning.lag * 1e3,
                f"; {warning.unlogged} more stall(s) over {tracker.warn_after * 1e3:.0f} ms since the last warning"
                if warning.unlogged
                else "",
            )
