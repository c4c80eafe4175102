"""Blocking database calls run in worker threads, each bounded by the store's timeout.

The drivers (sqlite3, psycopg, redis-py) block; trio must not. Each call runs in a thread of a
bounded pool (`limiter`) under `trio.fail_after(timeout)`; a call past its deadline is abandoned
(its thread finishes on the driver's own timeout, set to the same value) and the caller gets
`StoreUnavailable` at once. So does any error the driver raises for a backend that is down.

The runner logs each change of the backend's state once: a warning at the first call that finds
it down, and ``state store NAME is reachable again after N s`` at the first call that succeeds
after that. Operators see an outage's start and end, not one line per call; each ``--workers``
process logs its own (its lines name the worker).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

import trio

from trio_direct.state.base import StoreUnavailable

__all__ = ["ThreadRunner"]

log = logging.getLogger(__name__)

T = TypeVar("T")


class ThreadRunner:
    """Runs a backend's blocking calls off the event loop, with a deadline each."""

    def __init__(self, name: str, timeout: float, down_errors: tuple[type[BaseException], ...], threads: int = 8):
        self.name = name
        self.timeout = timeout
        self.down_errors = down_errors
        self.limiter = trio.CapacityLimiter(threads)
        #: `trio.current_time()` of the first failed call of the current outage; None while up.
        self.down_since: float | None = None

    async def __call__(self, call: Callable[[], T]) -> T:
        try:
            with trio.fail_after(self.timeout):
                result = await trio.to_thread.run_sync(call, abandon_on_cancel=True, limiter=self.limiter)
        except trio.TooSlowError:
            raise self._failed(f"did not answer within {self.timeout:g}s") from None
        except self.down_errors as error:
            raise self._failed(f"failed: {_first_line(error)}") from None
        if self.down_since is not None:
            log.info("state store %s is reachable again after %.1fs", self.name, trio.current_time() - self.down_since)
            self.down_since = None
        return result

    def _failed(self, why: str) -> StoreUnavailable:
        if self.down_since is None:
            self.down_since = trio.current_time()
            log.warning("state store %s is unavailable: it %s", self.name, why)
        return StoreUnavailable(f"the state store ({self.name}) {why}")


def _first_line(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    return text.splitlines()[0][:300]
