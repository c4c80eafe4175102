"""Blocking database calls run in worker threads, each bounded by the store's timeout.

The drivers (sqlite3, psycopg, redis-py) block; trio must not. Each call runs in a thread of a
bounded pool (`limiter`) under `trio.fail_after(timeout)`; a call past its deadline is abandoned
(its thread finishes on the driver's own timeout, set to the same value) and the caller gets
`StoreUnavailable` at once. So does any error the driver raises for a backend that is down.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import trio

from trio_direct.state.base import StoreUnavailable

__all__ = ["ThreadRunner"]

T = TypeVar("T")


class ThreadRunner:
    """Runs a backend's blocking calls off the event loop, with a deadline each."""

    def __init__(self, name: str, timeout: float, down_errors: tuple[type[BaseException], ...], threads: int = 8):
        self.name = name
        self.timeout = timeout
        self.down_errors = down_errors
        self.limiter = trio.CapacityLimiter(threads)

    async def __call__(self, call: Callable[[], T]) -> T:
        try:
            with trio.fail_after(self.timeout):
                return await trio.to_thread.run_sync(call, abandon_on_cancel=True, limiter=self.limiter)
        except trio.TooSlowError:
            raise StoreUnavailable(f"the state store ({self.name}) did not answer within {self.timeout:g}s") from None
        except self.down_errors as error:
            raise StoreUnavailable(f"the state store ({self.name}) failed: {_first_line(error)}") from None


def _first_line(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    return text.splitlines()[0][:300]
