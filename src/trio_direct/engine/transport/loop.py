"""The trio-asyncio loop engine calls run on, and how trio code enters it.

The loop is opened around the whole program (`open_asyncio_loop`); code that runs in a task that
did not inherit its contextvar (hypercorn's own CLI starts request tasks outside the context where
an app opened the loop) falls back to the loop the process opened.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import grpclib.utils
import trio
import trio_asyncio

__all__ = ["aio", "current_loop", "open_asyncio_loop", "settled"]

# trio-asyncio replaces asyncio.current_task on import (3.12's C one cannot see its loop), but grpclib
# keeps the one that was current when grpclib.utils was imported: in a program that imported grpclib
# first, every call would fail with "no running event loop". Point grpclib at the replacement.
grpclib.utils._current_task = asyncio.current_task

#: The loop opened by `open_asyncio_loop`, for tasks that do not inherit its contextvar: hypercorn's
#: own CLI starts request tasks outside the context where an app opened the loop.
_process_loop: trio_asyncio.TrioEventLoop | None = None


@asynccontextmanager
async def open_asyncio_loop() -> AsyncIterator[trio_asyncio.TrioEventLoop]:
    """The trio-asyncio loop every engine call needs; open it around the whole program.

    Reentrant: inside an open loop this yields that loop, so components that need one can ask for it
    without caring whether the program already opened it.
    """
    global _process_loop
    current = trio_asyncio.current_loop.get()
    if current is not None:
        yield current
        return
    async with trio_asyncio.open_loop() as loop:
        outer, _process_loop = _process_loop, loop
        try:
            yield loop
        finally:
            _process_loop = outer


def current_loop() -> trio_asyncio.TrioEventLoop:
    """This task's trio-asyncio loop, else the process's."""
    loop = trio_asyncio.current_loop.get()
    return loop if loop is not None else _process_loop


def aio(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`aio_as_trio` bound to this task's loop, else the process's."""
    return trio_asyncio.aio_as_trio(fn, loop=current_loop())


async def settled(call: asyncio.Task, timeout: float) -> None:
    """Wait for a cancelled call's asyncio task to finish its clean-up, shielded and bounded.

    Its stream reset must not outlive the trio block that opened it; a task that takes longer than
    ``timeout`` (it should take one loop turn) is left to finish on its own.
    """
    finished = trio.Event()
    call.add_done_callback(lambda _: finished.set())
    with trio.move_on_after(timeout, shield=True):
        await finished.wait()
