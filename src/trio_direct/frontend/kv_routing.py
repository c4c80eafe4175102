"""KV-aware routing for a running frontend (`--router-mode kv`): the engines' own KV events feed one
index per fleet, and a `KvRouter` weighs prefix overlap against load for every request.

- One ZMQ subscription per engine and DP rank (`KvEventSubscriber`), from the probed `kv_events`
  descriptor; events update the `KvIndex` at a routing block of ``--kv-cache-block-size`` tokens
  (16 by default, a multiple of every engine's page size), so a page-size-1 engine costs no more
  per event or per decision than a page-16 one.
- Engines that publish no events are routed by load alone, or, with ``--no-router-kv-events``,
  from an approximate index of this frontend's own decisions (TTL ``--router-ttl-secs``).
- Load is tracked from dispatch (`ActiveSequences`), released at the first token and at the end,
  and optionally corrected from the engines' `GetLoad` (``--load-poll-interval``), which is how load
  from other frontends is learnt.
- Disaggregated: the prefill pool is routed KV-aware, the decode pool by load only.
- An engine that joins after start-up (`engine_joined`) is registered and subscribed to like the
  others; its subscription runs in `run`'s nursery, so it ends with the rest.
- An engine that comes back with another card (`engine_changed`: a restart on new KV-event ports,
  another DP size or role) gets a new subscription; the old one is cancelled through its own
  cancel scope, so it stops dialling the old endpoints. A restart on the same endpoints keeps its
  subscription: the subscriber sees the publisher's sequence restart by itself.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import trio

from trio_direct.config import ServeConfig
from trio_direct.engine.errors import EngineError
from trio_direct.fleet.card import EngineCard
from trio_direct.fleet.fleet import Engine, Fleet, Worker
from trio_direct.routing.block_hash import RoutingKey
from trio_direct.routing.kv_index import KvIndex
from trio_direct.routing.kv_router import Decision, KvRouter, KvRouterConfig
from trio_direct.routing.kv_subscriber import KvEventSubscriber

log = logging.getLogger(__name__)

DEFAULT_ROUTING_BLOCK = 16


def routing_block_size(fleet: Fleet, configured: int | None) -> int:
    """The routing block: the flag, else the smallest multiple of every page size that is >= 16."""
    pages = {_page_size(engine) for engine in fleet.engines}
    if configured is not None:
        bad = sorted(p for p in pages if configured % p)
        if bad:
            raise ValueError(f"--kv-cache-block-size {configured} is not a multiple of the engines' page size {bad[0]}")
        return configured
    block = math.lcm(*pages) if pages else 1
    return block * math.ceil(DEFAULT_ROUTING_BLOCK / block)


def _page_size(engine: Engine) -> int:
    return _page_size_of(engine.card)


def _page_size_of(card: EngineCard) -> int:
    return card.kv_block_size or card.block_size or 1


def routing_key(worker: Worker) -> RoutingKey:
    return RoutingKey(worker.engine.id, worker.dp_rank)


def _keys(engine_id: str, card: EngineCard) -> list[RoutingKey]:
    """The routing keys of an engine with `card`: one, or one per DP rank."""
    ranks = [None] if card.dp_size <= 1 else list(range(card.dp_size))
    return [RoutingKey(engine_id, rank) for rank in ranks]


class _IndexSink:
    """Feeds one engine's events into the index, per DP rank."""

    def __init__(self, index: KvIndex, engine: Engine) -> None:
        self._index = index
        self._engine = engine
        self._single_rank = engine.card.dp_size <= 1
        #: Set when the subscription is replaced: a batch its cancelled task was already handed
        #: comes from the old endpoints (or DP layout) and must not reach the index.
        self.retired = False

    def _key(self, dp_rank: int) -> RoutingKey:
        return RoutingKey(self._engine.id, None if self._single_rank else dp_rank)

    def on_events(self, dp_rank: int, events: Sequence[Any]) -> None:
        if self.retired:
            return
        key = self._key(dp_rank)
        for event in events:
            self._index.apply(key, event)

    def on_clear(self, dp_rank: int, reason: str) -> None:
        if self.retired:
            return
        hint = ""
        if "lost" in reason:  # the engine still caches what the lost events told of
            hint = (
                "; prefixes the engine cached before stay unknown to routing until it evicts and "
                "re-stores them (a replay_endpoint in its --kv-events-config avoids this)"
            )
        log.info("KV index of %s cleared: %s%s", self._key(dp_rank), reason, hint)
        self._index.clear_worker(self._key(dp_rank))


@dataclass(slots=True, eq=False)
class _Subscription:
    """One engine's subscriber, and the cancel scope that stops it alone (`engine_changed`)."""

    subscriber: KvEventSubscriber
    sink: _IndexSink
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        with self.scope:
            await self.subscriber.run(task_status=task_status)


class KvRouting:
    """The index, the subscriptions and the routers of one frontend."""

    def __init__(self, fleet: Fleet, config: ServeConfig) -> None:
        self.fleet = fleet
        self.block_size = routing_block_size(fleet, config.kv_cache_block_size)
        self.use_events = config.router_kv_events
        self.index = KvIndex(self.block_size) if self.use_events else None
        router_config = KvRouterConfig(
            overlap_score_credit=config.router_kv_overlap_score_credit,
            prefill_load_scale=config.router_prefill_load_scale,
            temperature=config.router_temperature,
            use_kv_events=self.use_events,
            ttl_secs=config.router_ttl_secs,
            block_size=self.block_size,
        )
        self.router = KvRouter(router_config, self.index)
        # Decode engines of a disaggregated fleet hold no reusable prefix: load alone decides.
        load_only = KvRouterConfig(overlap_score_credit=0.0, block_size=self.block_size, use_kv_events=False)
        self.decode_router = KvRouter(load_only)
        #: Engine id → its running (or, before `run`, due) subscription.
        self._subscriptions: dict[str, _Subscription] = {}
        self.load_poll_interval = config.load_poll_interval
        #: `run`'s nursery while it runs: where the subscriptions of engines that join later run.
        self._nursery: trio.Nursery | None = None
        for engine in fleet.engines:
            self._index_engine(engine)

    @property
    def subscribers(self) -> list[KvEventSubscriber]:
        return [subscription.subscriber for subscription in self._subscriptions.values()]

    def _index_engine(self, engine: Engine) -> _Subscription | None:
        """Register the engine's ranks in the index; its subscription (not yet running), if it has one."""
        if self.index is None or engine.card.role == "decode":
            return None
        for key in _keys(engine.id, engine.card):
            self.index.register_worker(key, _page_size(engine))
        if not engine.card.kv_events:
            log.warning(
                "engine %s publishes no KV events: it is routed by load only (start SGLang with "
                "--kv-events-config, or run trio-direct with --no-router-kv-events)",
                engine.id,
            )
            return None
        sink = _IndexSink(self.index, engine)
        subscription = _Subscription(KvEventSubscriber(engine.id, engine.card.kv_events, sink), sink)
        self._subscriptions[engine.id] = subscription
        return subscription

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Keep the index fed (and load polled) until cancelled."""
        try:
            async with trio.open_nursery() as nursery:
                for subscription in list(self._subscriptions.values()):
                    await nursery.start(subscription.run)
                if self.load_poll_interval > 0:
                    nursery.start_soon(self._poll_load)
                self._nursery = nursery
                task_status.started()
        finally:
            self._nursery = None

    def check_join(self, engine: Engine) -> None:
        """Raise `ValueError` if `engine` cannot be indexed at this fleet's routing block."""
        if self.index is not None and engine.card.role != "decode" and self.block_size % _page_size(engine):
            raise ValueError(
                f"its page size {_page_size(engine)} does not divide the routing block {self.block_size} "
                "(set --kv-cache-block-size to a multiple of every engine's page size)"
            )

    def engine_joined(self, engine: Engine) -> None:
        """An engine joined the fleet after start-up: index it and follow its KV events."""
        subscription = self._index_engine(engine)
        if subscription is not None and self._nursery is not None:
            self._nursery.start_soon(subscription.run)

    def engine_changed(self, engine: Engine, old: EngineCard) -> None:
        """`engine` came back with a card other than `old`: follow its KV events where they are now.

        Only what KV routing depends on matters (role, DP size, page size, KV-event endpoints); an
        engine back on the same endpoints keeps its subscription, which notices the publisher's
        restart by itself. Otherwise the old subscription is cancelled (it would keep dialling
        endpoints nobody publishes on), ranks that no longer exist leave the index and the
        routers, and a new subscription starts from the new card.
        """
        new = engine.card
        if (old.role, old.dp_size, _page_size_of(old), old.kv_events) == (
            new.role, new.dp_size, _page_size_of(new), new.kv_events,
        ):  # fmt: skip
            return
        stopped = self._subscriptions.pop(engine.id, None)
        if stopped is not None:
            stopped.sink.retired = True
            stopped.scope.cancel()
        gone = set(_keys(engine.id, old)) - set(_keys(engine.id, new))
        for key in gone:
            if self.index is not None:
                self.index.remove_worker(key)
            self.router.remove_worker(key)
            self.decode_router.remove_worker(key)
        if self.index is None:
            return  # approximate mode: nothing subscribed, and new ranks are learnt as they are routed
        if new.role == "decode":
            for key in _keys(engine.id, new):
                self.index.remove_worker(key)  # decode engines are routed by load alone
        subscription = self._index_engine(engine)
        if subscription is not None and self._nursery is not None:
            self._nursery.start_soon(subscription.run)
        log.info(
            "engine %s came back with KV events at %s (was %s; %s, DP size %d, page %d): %s",
            engine.id, _endpoints(new), _endpoints(old), new.role, new.dp_size, _page_size_of(new),
            "re-subscribed" if subscription is not None else "routed by load only",
        )  # fmt: skip

    async def _poll_load(self) -> None:
        while True:
            for engine in list(self.fleet.engines):  # engines may join while a poll awaits
                if not engine.healthy:
                    continue
                try:
                    loads = await engine.client.load(timeout=min(self.load_poll_interval, 5.0))
                except EngineError as error:
                    log.debug("GetLoad on %s failed: %s", engine.id, error)
                    continue
                router = self.decode_router if engine.card.role == "decode" else self.router
                for load in loads:
                    rank = load.get("dp_rank")
                    key = RoutingKey(engine.id, rank if engine.card.dp_size > 1 else None)
                    router.active.set_external_load(
                        key,
                        running=int(load.get("num_running_reqs") or 0),
                        waiting=int(load.get("num_waiting_reqs") or 0),
                        used_tokens=int(load.get("num_used_tokens") or 0),
                        waiting_tokens=load.get("num_waiting_uncached_tokens"),
                    )
            await trio.sleep(self.load_poll_interval)

    def engine_down(self, engine: Engine) -> None:
        """Forget what `engine` caches (its events stopped being trustworthy) and its load."""
        subscription = self._subscriptions.get(engine.id)
        if subscription is not None:
            subscription.subscriber.engine_down()
        for key in _keys(engine.id, engine.card):
            if self.index is not None:
                self.index.clear_worker(key)
            self.router.remove_worker(key)
            self.decode_router.remove_worker(key)

    # ---- per request ------------------------------------------------------------------------------

    def choose(
        self, router: KvRouter, workers: Sequence[Worker], token_ids: Sequence[int], request_id: str | None
    ) -> tuple[Worker, Decision]:
        """Route (or, without a request id, only weigh) `token_ids` over `workers`."""
        by_key = {routing_key(w): w for w in workers}
        keys = list(by_key)
        if request_id is None:
            decision = router.decide(token_ids, keys)
        else:
            decision = router.route(request_id, token_ids, keys)
            log.debug("%s", decision.explain())
        return by_key[decision.worker], decision

    def first_token(self, request_id: str) -> None:
        self.router.first_token(request_id)
        self.decode_router.first_token(request_id)

    def free(self, request_id: str) -> None:
        self.router.free(request_id)
        self.decode_router.free(request_id)

    def stats(self) -> dict[str, Any]:
        return {
            "block_size": self.block_size,
            "mode": "events" if self.use_events else "approximate",
            "index": self.index.stats() if self.index is not None else None,
            "subscribers": {s.engine: s.counters.as_dict() for s in self.subscribers},
        }


def _endpoints(card: EngineCard) -> str:
    return ", ".join(source.endpoint for source in card.kv_events) or "none"
