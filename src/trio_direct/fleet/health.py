"""Engine health: a `HealthCheck` loop per engine, and marking engines down on real failures.

An engine is marked down after `failures_to_down` consecutive failed checks (a failure is an error
or ``healthy: false``, each check bounded by `timeout`), or at once when a real request finds it
unreachable (`EngineHealth.unreachable`). It is marked up again after a successful check and a fresh
probe whose card still agrees with the fleet (same model, same block size); a changed card that
passes the frontend's own rules (`check_join`) is applied and reported (`on_change`: KV routing
follows new KV-event endpoints), a changed model or block size, or a card the frontend refuses, is
refused loudly and the engine stays down. Routing never picks a down engine (`Fleet.workers` skips it).

A health check that goes unanswered within `timeout` while the engine has open calls and produced
nothing on any of them during the check means the engine is hung (stopped, deadlocked): it is marked
down at once and its calls are failed (`OpenCalls.fail_calls`), so their requests retry or migrate
in seconds instead of waiting as long as the hang lasts. An engine that answers its check is busy,
however long its prefill takes, and one that streamed during the check is busy too. Calls that
asked for their answer whole stay silent until their end: when the watch finds such calls quiet on
an engine for the idle timeout, it asks for a check of that engine at once (`check_soon`).

Engines that were not up at start-up (`Fleet.pending`) are probed every `interval` instead; one
whose probe works and whose card agrees with the fleet joins it (`Fleet.join`), and from then on is
watched like the others. One that disagrees is refused loudly and stays pending: an operator may
still restart it with the right flags.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any, Protocol

import trio

from trio_direct.engine.errors import EngineDeadlineExceeded, EngineError, EngineUnavailable
from trio_direct.engine.transport import ChannelPool
from trio_direct.fleet.card import CardError, EngineCard
from trio_direct.fleet.engine_apis import AUTO
from trio_direct.fleet.fleet import Engine, Fleet, FleetError, PendingEngine
from trio_direct.fleet.probe import probe_engine

log = logging.getLogger(__name__)


class OpenCalls(Protocol):
    """The frontend's open engine calls, as a health check that went unanswered asks about them
    (`core.watch.StreamWatch`)."""

    def quiet_calls(self, client: Any, since: float) -> int:
        """Calls to `client` open before `since` (trio time) if it delivered nothing since then, else 0."""
        ...

    def fail_calls(self, client: Any, since: float, reason: str) -> int:
        """Fail the calls to `client` open before `since`: their engine is hung."""
        ...


#: A check whose timeout fired this much later than asked was held up by this frontend's own event
#: loop: it tells nothing about the engine.
_LATE_TIMEOUT = 0.5


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
        api: str = AUTO,
        on_down: Callable[[Engine], None] | None = None,
        check_join: Callable[[Engine], None] | None = None,
        on_join: Callable[[Engine], None] | None = None,
        on_change: Callable[[Engine, EngineCard], None] | None = None,
        calls: OpenCalls | None = None,
    ) -> None:
        self.fleet = fleet
        self.pool = pool
        self.interval = interval
        self.timeout = timeout
        self.failures_to_down = failures_to_down
        self.api = api
        self.on_down = on_down
        #: The frontend's own rules for a joining engine, or one back with a changed card (raise
        #: `FleetError` to refuse it), and what joining means beyond routing (KV index, subscriptions).
        self.check_join = check_join
        self.on_join = on_join
        #: Called with the engine (its new card applied) and its old card when it came back changed.
        self.on_change = on_change
        #: The open engine calls, to tell a hung engine from a busy one when a check goes unanswered.
        self.calls = calls
        self._failures: dict[str, int] = {engine.id: 0 for engine in fleet.engines}
        #: Why a down engine that answers again was refused, last time (logged once per reason).
        self._refused: dict[str, str] = {}
        #: Engine id -> the cancel scope of its watch (`forget` stops one alone).
        self._watches: dict[str, trio.CancelScope] = {}
        #: `run`'s nursery while it runs: where engines that join later are watched (`watch`).
        self._nursery: trio.Nursery | None = None
        #: Engine id -> set to check it before its interval is up (`check_soon`).
        self._soon: dict[str, trio.Event] = {}
        # A watch that reports engines whose calls asked whole went quiet (`StreamWatch.on_quiet`)
        # gets its checks at once; an `OpenCalls` without that list only answers the checks' questions.
        on_quiet = getattr(calls, "on_quiet", None)
        if on_quiet is not None:
            on_quiet.append(self.check_soon)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                for engine in self.fleet.engines:
                    self.watch(engine)
                for pending in list(self.fleet.pending):
                    nursery.start_soon(self._watch_pending, pending)
                task_status.started()
        finally:
            self._nursery = None

    def watch(self, engine: Engine) -> None:
        """Check `engine` every interval from now on (one that joined the fleet after `run` began)."""
        assert self._nursery is not None, "EngineHealth.watch needs run() running"
        self._failures.setdefault(engine.id, 0)
        scope = self._watches[engine.id] = trio.CancelScope()
        self._nursery.start_soon(self._watch_within, engine, scope)

    def forget(self, engine: Engine) -> None:
        """Stop checking `engine` (it left the fleet): no check, and no callback, concerns it again."""
        scope = self._watches.pop(engine.id, None)
        if scope is not None:
            scope.cancel()
        self._failures.pop(engine.id, None)
        self._refused.pop(engine.id, None)
        self._soon.pop(engine.id, None)

    async def _watch_within(self, engine: Engine, scope: trio.CancelScope) -> None:
        with scope:
            await self._watch(engine)

    def unreachable(self, engine: Engine, reason: str) -> None:
        """A real request could not reach `engine`: take it out of routing until a check passes."""
        if engine.healthy:
            self._failures[engine.id] = self.failures_to_down
            self._mark_down(engine, reason)

    async def _watch(self, engine: Engine) -> None:
        while True:
            soon = self._soon[engine.id] = trio.Event()
            with trio.move_on_after(self.interval):
                await soon.wait()
            await self.check(engine)

    def check_soon(self, client: Any) -> None:
        """Check the engine of `client` now rather than at its next interval (the watch found calls
        that asked for their answer whole quiet on it for the idle timeout). The check runs in the
        engine's own watch, so a check under way is not doubled and `forget` stops it."""
        for engine in self.fleet.engines:
            if engine.client is client and engine.id in self._watches:
                soon = self._soon.get(engine.id)
                if soon is not None:
                    soon.set()

    async def _watch_pending(self, pending: PendingEngine) -> None:
        """Probe until it joins, then watch it like any engine (the same task, so it ends with
        the health loop)."""
        while True:
            await trio.sleep(self.interval)
            engine = await self.try_join(pending)
            if engine is not None:
                break
        scope = self._watches[engine.id] = trio.CancelScope()
        await self._watch_within(engine, scope)

    async def try_join(self, pending: PendingEngine) -> Engine | None:
        """Probe a pending engine once; the engine when it joined the fleet, else None."""
        name = f"engine {pending.id} ({pending.url})"
        try:
            with trio.fail_after(self.timeout * 5):
                probed = await probe_engine(pending.url, self.pool, api=self.api, timeout=self.timeout * 5)
        except (EngineUnavailable, EngineDeadlineExceeded, trio.TooSlowError) as error:
            reason = str(error) or "no answer"
            if reason != pending.reason:
                log.info("%s is still not up (%s); it joins when it comes up", name, reason)
            pending.reason = reason
            return None
        except (EngineError, CardError, ValueError) as error:
            self._refuse(pending, f"{name} answers but cannot be used: {error}")
            return None
        try:
            engine = self.fleet.join(pending, probed, check=self.check_join)
        except FleetError as error:
            self._refuse(pending, f"{name} is up but cannot join the fleet: {error}")
            return None
        self._failures[engine.id] = 0
        card = engine.card
        log.info(
            "engine %s (%s) is up and joins the fleet (%s API, %s); serving from %d engine(s)",
            engine.id, card.url, card.api, card.role, len(self.fleet.engines),
        )  # fmt: skip
        if self.on_join is not None:
            self.on_join(engine)
        return engine

    def _refuse(self, pending: PendingEngine, reason: str) -> None:
        """Loud, but once per reason: the engine is probed again every interval."""
        if reason != pending.reason:
            log.error("%s; it stays out of routing", reason)
        pending.reason = reason

    async def check(self, engine: Engine) -> None:
        """One health check of `engine`, and what follows from it."""
        started = trio.current_time()
        try:
            with trio.fail_after(self.timeout):
                healthy = await engine.client.health(timeout=self.timeout)
            reason = "" if healthy else "HealthCheck answered healthy=false"
        except (EngineError, trio.TooSlowError) as error:
            healthy, reason = False, str(error) or f"no answer in {self.timeout:g}s"
            unanswered = isinstance(error, (trio.TooSlowError, EngineDeadlineExceeded))
            if unanswered and self._hung(engine, started):
                return
            if unanswered and self._streaming(engine):
                # SGLang answers HealthCheck through its scheduler: under load it queues. An engine
                # that just delivered tokens is busy, not down (nor is a frontend whose own event
                # loop stalled past the timeout).
                log.info(
                    "engine %s: health check unanswered in %gs, but it is streaming output", engine.id, self.timeout
                )
                return
        if not healthy:
            self._failures[engine.id] += 1
            if engine.healthy and self._failures[engine.id] >= self.failures_to_down:
                self._mark_down(engine, reason)
            return
        self._failures[engine.id] = 0
        if not engine.healthy:
            await self._bring_back(engine)

    def _hung(self, engine: Engine, started: float) -> bool:
        """The check begun at `started` went unanswered: if `engine` also has open calls and produced
        nothing on any during the check, it is hung: marked down, its calls failed. True if so."""
        calls = self.calls
        if calls is None:
            return False
        if trio.current_time() - started > self.timeout + _LATE_TIMEOUT:
            return False  # this frontend's loop was stalled: output may be waiting unread
        quiet = calls.quiet_calls(engine.client, started)
        if not quiet:
            return False
        reason = f"hung: no answer to its health check in {self.timeout:g}s and no output on its {quiet} open call(s)"
        self._failures[engine.id] = self.failures_to_down
        if engine.healthy:
            self._mark_down(engine, reason)
        # Every open call goes, those that came during the check included: none will be answered.
        calls.fail_calls(engine.client, math.inf, f"engine {engine.id} is {reason}")
        return True

    def _streaming(self, engine: Engine) -> bool:
        """Output arrived from `engine` during this check or the interval before it."""
        since = trio.current_time() - getattr(engine.client, "last_output_at", -math.inf)
        return since < self.interval + self.timeout

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
            self._refuse_back(
                engine,
                f"engine {engine.id} came back serving model {card.served_model_name!r} with block size "
                f"{card.block_size} (was {engine.card.served_model_name!r}, {engine.card.block_size}): kept out of routing",
            )
            return
        if card != engine.card:
            if self.check_join is not None:
                try:
                    self.check_join(Engine(engine.id, card, probed.client, healthy=False))
                except FleetError as error:
                    self._refuse_back(
                        engine,
                        f"engine {engine.id} came back with a card this frontend refuses: {error}; it stays down",
                    )
                    return
            log.info("engine %s came back with a changed card; applying it", engine.id)
            old, engine.card, engine.client = engine.card, card, probed.client
            if self.on_change is not None:
                self.on_change(engine, old)
        engine.healthy = True
        self._refused.pop(engine.id, None)
        log.info("engine %s (%s) is up again (model %s)", engine.id, card.url, model.served_model_name)

    def _refuse_back(self, engine: Engine, reason: str) -> None:
        """Loud, but once per reason: a down engine is checked again every interval."""
        if self._refused.get(engine.id) != reason:
            log.error("%s", reason)
        self._refused[engine.id] = reason
