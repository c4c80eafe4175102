"""Small helpers for tests (importable from every test folder: `from support import ...`)."""

from __future__ import annotations

from collections.abc import Callable

import trio


async def wait_until(predicate: Callable[[], bool], timeout: float = 5.0, interval: float = 0.005) -> None:
    """Poll `predicate` until it holds; fail the test after `timeout` seconds."""
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(interval)
