"""The task that builds what requests are served from and keeps it alive: fleet, pools, lifecycle.

`run_frontend` opens the asyncio loop the engine transport needs, starts built-in mock engines when
no engine is named (`engine_sources`), probes the engines given on the command line and opens their
models' pools (`model_pools.open_model_pool`), starts the discovery sources (DNS, SRV, a file), then
reports a `core.frontend.Frontend` and holds everything open until cancelled. `FleetPools` opens a
pool when the first engine of a new model joins and closes it when its last engine left; each pool's
tasks (KV feeds, health checks) run in a nursery of its own inside `run_frontend`'s. The composition
root (`trio_direct.service`) runs it for both entry points: `trio-direct serve` and
`hypercorn trio_direct.app:app`.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Sequence
from contextlib import suppress
from functools import partial
from pathlib import Path

import trio

from trio_direct import tracing
from trio_direct.config import ServeConfig
from trio_direct.core.frontend import Frontend, store_settings
from trio_direct.core.model_pool import ModelPool, check_role
from trio_direct.core.watch import StreamWatch
from trio_direct.engine.transport import ChannelPool, client_config, open_transport
from trio_direct.fleet.card import EngineCard
from trio_direct.fleet.discovery import EngineIds, EngineSpec
from trio_direct.fleet.fleet import Engine, Fleet, FleetError, fleet_model, probe_fleet
from trio_direct.fleet.membership import Member, Membership
from trio_direct.fleet.pool_settings import PoolSettings
from trio_direct.fleet.probe import ProbedEngine
from trio_direct.fleet.shared_admin import SharedAdmin
from trio_direct.fleet.sources import (
    run_source,
)
from trio_direct.frontend.engine_sources import engine_sources, has_engine_sources, start_mock_engines
from trio_direct.frontend.gc_policy import run_gc_policy
from trio_direct.frontend.loop_lag import monitor_loop_lag
from trio_direct.frontend.model_pools import (
    connect_for_generation,
    open_model_pool,
    run_model_pool,
)
from trio_direct.state.store import (
    StateStore,
    StoreUnavailable,
    UnknownStore,
    check_url,
    open_state_store,
)
from trio_direct.text.chat_template import load_chat_template

log = logging.getLogger(__name__)


class FleetPools:
    """The frontend's model pools as engines come and go: the `PoolHost` of the fleet's membership.

    An engine of a model nobody serves yet opens that model's pool (`open_model_pool`; its tasks run
    in a nursery of their own inside the frontend's, `run_model_pool`); an engine of a served model
    is checked against its pool (`fleet_model`'s agreement, role, KV routing block), connected ahead,
    subscribed to, and only then routable. A pool whose last engine drained closes: its tasks are
    cancelled and its model is no longer listed.
    """

    def __init__(
        self,
        config: ServeConfig,
        frontend: Frontend,
        channels: ChannelPool,
        nursery: trio.Nursery,
        settings: PoolSettings,
        chat_template: str | None,
        watch: StreamWatch | None = None,
    ) -> None:
        self.watch = watch
        self.config = config
        self.frontend = frontend
        self.channels = channels
        self.nursery = nursery
        self.settings = settings
        self.chat_template = chat_template
        self.membership: Membership | None = None
        self._scopes: dict[str, trio.CancelScope] = {}
        self._locks: dict[str, trio.Lock] = {}

    def pool_name(self, spec: EngineSpec, card: EngineCard) -> str:
        return self.settings.pool_name(spec.model or card.served_model_name)

    async def open_pool(self, name: str, engines: list[Engine], sources: Sequence[str] = ()) -> ModelPool:
        """Open the pool of model `name` with its first `engines` (`FleetError` if they cannot serve
        together or the model cannot be loaded)."""
        overrides = self.settings.overrides(name, [pool.name for pool in self.frontend.pools()])
        fleet = Fleet(engines, fleet_model([(e.id, e.card) for e in engines], overrides), overrides=overrides)
        for engine in engines:
            check_role(engine, self.config.prefill_engine_url)
        pool = await open_model_pool(
            self.config, fleet, self.channels, self.chat_template, on_engine_down=self._engine_down, watch=self.watch
        )
        pool.waiting = partial(self._waiting_for, name)
        await connect_for_generation(engines)
        scope = self._scopes[name] = trio.CancelScope()
        await self.nursery.start(run_model_pool, pool, scope)
        self.frontend.add_pool(pool)
        log.info(
            "serving model %r from %d engine(s): %s",
            pool.name,
            len(engines),
            ", ".join(f"{e.id}={e.card.host}:{e.card.port} ({e.card.api}, {e.card.role})" for e in engines),
        )
        return pool

    # ---- PoolHost ---------------------------------------------------------------------------------

    async def join(self, member: Member, probed: ProbedEngine) -> tuple[str, Engine]:
        card = probed.card
        expected = member.spec.role
        if expected is not None and card.role != expected:
            raise FleetError(f"it reports role {card.role!r}, but its source names it a {expected} engine")
        name = self.pool_name(member.spec, card)
        engine = Engine(member.id, card, probed.client)
        lock = self._locks.setdefault(name, trio.Lock())
        try:
            async with lock:  # one engine of a model at a time: the first one opens its pool
                pool = self.frontend.find_pool(name)
                if pool is None:
                    await self.open_pool(name, [engine])
                    return name, engine
                pool.fleet.admits(engine, pool.check_join)
                await connect_for_generation([engine])
                pool.engine_joined(engine)  # KV events followed before the first request goes there
                try:
                    pool.fleet.add(engine, pool.check_join)
                except FleetError:
                    pool.engine_left(engine)
                    raise
                if pool.health is not None:
                    pool.health.watch(engine)
        finally:
            # A pool whose last engine drained while this one joined it stays open until here.
            left = self.frontend.find_pool(name)
            if left is not None:
                self._close_if_empty(left)
        log.info(
            "engine %s (%s) joins model %r (%s API, %s); serving it from %d engine(s)",
            engine.id, card.url, name, card.api, card.role, len(pool.fleet.engines),
        )  # fmt: skip
        return name, engine

    def withdraw(self, engine: Engine) -> None:
        pool = self._pool_of(engine)
        if pool is None:
            return
        if pool.health is not None:
            pool.health.forget(engine)
        pool.fleet.withdraw(engine)
        if not pool.fleet.engines:
            log.warning("model %r has no engine left: its requests get 503 until one joins", pool.name)

    def forget(self, engine: Engine) -> None:
        pool = self._pool_of(engine)
        if pool is None:
            return
        pool.fleet.forget(engine)
        pool.engine_left(engine)
        self._close_if_empty(pool)

    def _close_if_empty(self, pool: ModelPool) -> None:
        """Close `pool` if no engine is in it, draining from it, or joining it right now."""
        lock = self._locks.get(pool.name)
        if pool.fleet.engines or pool.fleet.draining or (lock is not None and lock.locked()):
            return
        self.frontend.remove_pool(pool)
        scope = self._scopes.pop(pool.name, None)
        if scope is not None:
            scope.cancel()
        log.info("model %r is no longer served: its last engine left", pool.name)

    # ---- helpers ----------------------------------------------------------------------------------

    def _pool_of(self, engine: Engine) -> ModelPool | None:
        for pool in self.frontend.pools():
            if engine in pool.fleet.engines or engine in pool.fleet.draining:
                return pool
        return None

    def _engine_down(self, engine: Engine) -> None:
        if self.membership is not None:
            self.membership.engine_down(engine)

    def _waiting_for(self, name: str) -> list[Member]:
        """Engines in no pool yet that may join `name`'s (their source names no other model)."""
        if self.membership is None:
            return []
        return [
            m
            for m in self.membership.waiting()
            if m.spec.model is None or self.settings.pool_name(m.spec.model) == name
        ]


async def run_frontend(
    config: ServeConfig, *, task_status: trio.TaskStatus[Frontend] = trio.TASK_STATUS_IGNORED
) -> None:
    """Start the fleet and its pools, report the `Frontend`, and keep everything running until cancelled.

    Engines given with `--engine-url`/`--prefill-engine-url` are probed first and start-up waits for
    them as it always did (`probe_fleet`); the discovery sources are then asked once, and start-up
    waits (at most `--engine-wait-timeout`) for a first probe of every engine they named.
    """
    async with open_transport(), trio.open_nursery() as nursery:
        keepalive = client_config(config.engine_keepalive_interval, config.engine_keepalive_timeout)
        channels = ChannelPool(connect_timeout=config.connect_timeout, config=keepalive)
        try:
            try:
                settings = PoolSettings.parse(config.served_model_name, config.model_path, config.kv_cache_block_size)
            except ValueError as error:
                raise FleetError(str(error)) from None
            try:
                check_url(config.state_store or "memory")
            except UnknownStore as error:
                raise FleetError(str(error)) from None
            if not (config.state_store_timeout > 0 and config.state_store_max_entry_bytes > 0):
                raise FleetError("--state-store-timeout and --state-store-max-entry-bytes must be > 0")
            sources = engine_sources(config)
            static = [("engine-url", url) for url in config.engine_url]
            static += [("prefill-engine-url", url) for url in config.prefill_engine_url]
            if not has_engine_sources(config):
                urls = await start_mock_engines(config.mock_engines, config.mock_speedup, nursery)
                static = [("engine-url", url) for url in urls]
            template = load_chat_template(Path(config.chat_template)) if config.chat_template else None
            state: StateStore = await nursery.start(_hold_state_store, config)
            frontend = Frontend(config, state=state)
            tracing.configure(config.otlp_traces_endpoint)
            # One watch over every pool's streams and engine calls (SSE keep-alives, hung engines).
            watch = StreamWatch(keepalive=config.sse_keepalive, stall_timeout=config.stream_idle_timeout)
            nursery.start_soon(watch.run)
            pools = FleetPools(config, frontend, channels, nursery, settings, template, watch)
            membership = Membership(
                pools,
                channels,
                ids=EngineIds(len(static)),
                api=config.engine_api,
                probe_interval=config.health_interval if config.health_interval > 0 else config.discovery_interval,
                probe_timeout=max(config.health_timeout * 5, 1.0),
                drain_timeout=config.drain_timeout,
                abort_timeout=config.abort_timeout,
            )
            frontend.membership = pools.membership = membership
            await nursery.start(membership.run)
            if static:
                await _start_static_engines(config, static, channels, pools, membership)
            # The admin API's engines, shared by every frontend on the store: follow them from now on.
            shared = frontend.shared_admin = SharedAdmin(state, membership, config.fleet_sync_interval)
            with suppress(StoreUnavailable):
                await shared.sync_once()
            if config.fleet_sync_interval > 0:
                nursery.start_soon(shared.run)
            grace = config.discovery_interval if config.discovery_grace is None else config.discovery_grace
            for source in sources:
                membership.add_source(source.state(grace))
                await nursery.start(run_source, source, membership, config.discovery_interval)
            with trio.move_on_after(config.engine_wait_timeout):
                for member in membership.members():
                    await member.settled.wait()
            if not frontend.pools():
                log.warning("no engine is serving yet: /health answers 503 until one joins")
            nursery.start_soon(monitor_loop_lag)
            if config.gc_full_collection_growth > 0:
                nursery.start_soon(partial(run_gc_policy, config.gc_full_collection_growth))
            # Everything loaded so far (modules, tokenizer, templates) lives as long as the process:
            # keep it out of the cyclic GC, whose full collections otherwise walk those ~60k
            # objects each time and stall every stream for tens of milliseconds.
            gc.freeze()
            task_status.started(frontend)
            await trio.sleep_forever()
        finally:
            channels.close()
            nursery.cancel_scope.cancel()


async def _hold_state_store(config: ServeConfig, *, task_status: trio.TaskStatus[StateStore]) -> None:
    """Open `--state-store` and keep it open until cancelled."""
    url = config.state_store or "memory"
    async with open_state_store(url, store_settings(config)) as store:
        log.info("state store: %s", store.url)
        task_status.started(store)
        await trio.sleep_forever()


async def _start_static_engines(
    config: ServeConfig, static: list[tuple[str, str]], channels: ChannelPool, pools: FleetPools, membership: Membership
) -> None:
    """Probe the engines given on the command line, open their models' pools, and hand those not
    up yet to the membership (they keep their ids, positions in the URL lists)."""
    probed, pending = await probe_fleet(
        [url for _, url in static],
        channels,
        api=config.engine_api,
        wait_timeout=config.engine_wait_timeout,
        join_grace=config.engine_join_grace,
    )
    source_of = {url: source for source, url in static}
    groups: dict[str, list[Engine]] = {}
    for engine_id, found in probed:
        name = pools.pool_name(EngineSpec(found.card.url), found.card)
        groups.setdefault(name, []).append(Engine(engine_id, found.card, found.client))
    for name, engines in groups.items():
        await pools.open_pool(name, engines)
        for engine in engines:
            membership.adopt(source_of[engine.card.url], EngineSpec(engine.card.url), name, engine)
    for waiting in pending:
        membership.want(source_of[waiting.url], EngineSpec(waiting.url), engine_id=waiting.id, reason=waiting.reason)
