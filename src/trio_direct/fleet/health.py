"""Engine health: a `HealthCheck` loop per engine, and marking engines down on real failures.

An engine is marked down after `failures_to_down` consecutive failed checks (a failure is an error
or ``healthy: false``, each check bounded by `timeout`), or at once when a real request finds it
unreachable (`EngineHealth.unreachable`). It is marked up again after a successful check and a fresh
probe whose card still agrees with the fleet (same model, same block size); a changed card is
applied, a changed model or block size is refused loudly and the engine stays down. Routing never
picks a down engine (`Fleet.workers` skips it).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio

from trio_direct.engine.errors import EngineError
from trio_direct.engine.transport import ChannelPool
from trio_direct.fleet.fleet import Engine, Fleet
from trio_direct.fleet.probe import probe_engine

log = logging.getLogger(__name__)


class EngineHealth:
    """Health state of the fleet's engines and the loop that keeps it current."""

    def __init__(
        self,
        fleet: Fleet,
        pool: ChannelPool,
        *,
        interval: float = 5.0,
        timeout: float = 2.0,
        failures_to_down: int = 2,
        api: str = "auto",
        on_down: Callable[[Engine], None] | None = None,
    ) -> None:
        self.fleet = fleet
        self.pool = pool
        self.interval = interval
        self.timeout = timeout
        self.failures_to_down = failures_to_down
        self.api = api
        self.on_down = on_down
        self._failures: dict[str, int] = {engine.id: 0 for engine in fleet.engines}

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            for engine in self.fleet.engines:
                nursery.start_soon(self._watch, engine)
            task_status.started()

    def unreachable(self, engine: Engine, reason: str) -> None:
        """A real request could not reach `engine`: take it out of routing until a check passes."""
        if engine.healthy:
            self._failures[engine.id] = self.failures_to_down
            self._mark_down(engine, reason)

    async def _watch(self, engine: Engine) -> None:
        while True:
            await trio.sleep(self.interval)
            await self.check(engine)

    async def check(self, engine: Engine) -> None:
        """One health check of `engine`, and what follows from it."""
        try:
            with trio.fail_after(self.timeout):
                healthy = await engine.client.health(timeout=self.timeout)
            reason = "" if healthy else "HealthCheck answered healthy=false"
        except (EngineError, trio.TooSlowError) as error:
            healthy, reason = False, str(error) or f"no answer in {self.timeout:g}s"
        if not healthy:
            self._failures[engine.id] += 1
            if engine.healthy and self._failures[engine.id] >= self.failures_to_down:
                self._mark_down(engine, reason)
            return
        self._failures[engine.id] = 0
        if not engine.healthy:
            await self._bring_back(engine)

    def _mark_down(self, engine: Engine, reason: str) -> None:
        engine.healthy = False
        log.warning("engine %s (%s) marked down: %s", engine.id, engine.card.url, reason)
        if self.on_down is not None:
            self.on_down(engine)

    async def _bring_back(self, engine: Engine) -> None:
        try:
            with trio.fail_after(self.timeout * 5):
                probed = await probe_engine(engine.card.url, self.pool, api=self.api, timeout=self.timeout * 5)
        except (EngineError, trio.TooSlowError, ValueError) as error:
            log.info("engine %s answers health checks but its probe failed: %s", engine.id, error)
            return
        card = probed.card
        model = self.fleet.model
        if card.served_model_name != engine.card.served_model_name or card.block_size != engine.card.block_size:
            log.error(
                "engine %s came back serving model %r with block size %s (was %r, %s): kept out of routing",
                engine.id, card.served_model_name, card.block_size, engine.card.served_model_name, engine.card.block_size,
            )  # fmt: skip
            return
        if card != engine.card:
            log.info("engine %s came back with a changed card; applying it", engine.id)
            engine.card = card
            engine.client = probed.client
        engine.healthy = True
        log.info("engine %s (%s) is up again (model %s)", engine.id, card.url, model.served_model_name)
