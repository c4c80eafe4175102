"""`GetLoad` polling for every router mode: what `--engine-busy-threshold` decides from.

Every ``interval`` seconds each healthy engine is asked for its load, all engines at once (an engine
that does not answer within the interval holds up no other), and each answer goes to every consumer
(the busy tracker; in kv mode also KV routing, which then does not poll on its own). Once a round is
in, `round_done` runs: admission re-checks the requests waiting for an engine to have room.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from contextlib import aclosing
from typing import Any

import trio
import trio_util

from trio_direct.engine.errors import EngineError
from trio_direct.fleet.fleet import Engine, Fleet

__all__ = ["poll_loads"]

log = logging.getLogger(__name__)

LoadConsumer = Callable[[Engine, list[dict[str, Any]]], None]


async def poll_loads(
    fleet: Fleet, interval: float, consumers: Sequence[LoadConsumer], round_done: Callable[[], None]
) -> None:
    """Poll until cancelled."""
    timeout = min(interval, 5.0)

    async def poll(engine: Engine) -> None:
        try:
            with trio.move_on_after(timeout):
                loads = await engine.client.load(timeout=timeout)
                for consume in consumers:
                    consume(engine, loads)
        except EngineError as error:
            log.debug("GetLoad on %s failed: %s", engine.id, error)

    # aclosing: a cancelled loop closes the generator here, not in a later garbage collection.
    async with aclosing(trio_util.periodic(interval)) as ticks:
        async for _ in ticks:
            async with trio.open_nursery() as nursery:
                for engine in list(fleet.engines):  # engines may join while a round runs
                    if engine.healthy:
                        nursery.start_soon(poll, engine)
            round_done()
