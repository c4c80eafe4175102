"""Prompt work every surface shares: long prompts are rendered and tokenized off the event loop."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import trio

__all__ = ["THREAD_THRESHOLD_CHARS", "in_thread_if_long"]

#: Prompts longer than this (characters) are rendered and tokenized on a worker thread, so that one
#: long prompt does not stall every other stream on the event loop.
THREAD_THRESHOLD_CHARS = 4096

T = TypeVar("T")


async def in_thread_if_long(size: int, fn: Callable[..., T], *args: object) -> T:
    """`fn(*args)` on a worker thread when the prompt is `size` characters or more, else inline."""
    if size > THREAD_THRESHOLD_CHARS:
        return await trio.to_thread.run_sync(fn, *args)
    return fn(*args)
