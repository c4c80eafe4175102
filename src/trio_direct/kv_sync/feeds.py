"""What keeps KV routing's view of the engines current: their KV events and their load.

One subscription per engine feeds the fleet's `LoadAwareRouting` index: over ZMQ for SGLang engines (a
`KvEventSubscriber`, one SUB socket per DP rank), over the engine's own gRPC API for vLLM engines
(a `GrpcKvEventSubscriber`, one `SubscribeKvEvents` stream carrying every rank); `GetLoad` polling (``--load-poll-interval``, 1 s by default) feeds its
load: what every frontend has on each engine, to which `LoadAwareRouting` adds this one's own requests
since the poll was sent.

- An engine that joins after start-up (`engine_joined`) is registered and subscribed to like the
  others; its subscription runs in `run`'s nursery, so it ends with the rest.
- An engine that comes back with another card (`engine_changed`: a restart on new KV-event ports,
  another DP size or role) gets a new subscription; the old one is cancelled through its own
  cancel scope, so it stops dialling the old endpoints. A restart on the same endpoints keeps its
  subscription: the subscriber sees the publisher's sequence restart by itself.
"""

from __future__ import annotations

import logging
from contextlib import aclosing
from dataclasses import dataclass, field

import trio
import trio_util

from trio_direct.engine.errors import EngineError
from trio_direct.fleet.card import EngineCard
from trio_direct.fleet.engine_apis import engine_api
from trio_direct.fleet.fleet import Engine, Fleet
from trio_direct.kv_sync.grpc_subscriber import GrpcKvEventSubscriber
from trio_direct.kv_sync.subscriber import KvEventSubscriber
from trio_direct.routing.load_aware import IndexSink, LoadAwareRouting, page_size

__all__ = ["KvFeeds"]

log = logging.getLogger(__name__)


Subscriber = KvEventSubscriber | GrpcKvEventSubscriber


def _subscriber(engine: Engine, sink: IndexSink) -> Subscriber:
    """The subscriber for the engine's API's KV feed: a gRPC stream (vLLM's) or ZMQ publishers."""
    card = engine.card
    if engine_api(card.api).kv_feed == "grpc":
        return GrpcKvEventSubscriber(engine.id, card.host, card.port, range(card.dp_size), sink)
    # Batches of an engine that is not serving are dropped (a stray publisher on a dead engine's port).
    return KvEventSubscriber(engine.id, card.kv_events, sink, serving=lambda: engine.healthy)


@dataclass(slots=True, eq=False)
class _Subscription:
    """One engine's subscriber, and the cancel scope that stops it alone (`engine_changed`)."""

    subscriber: Subscriber
    sink: IndexSink
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        with self.scope:
            await self.subscriber.run(task_status=task_status)


class KvFeeds:
    """The KV-event subscriptions and the load polling of one fleet."""

    def __init__(self, kv: LoadAwareRouting, fleet: Fleet, *, load_poll_interval: float = 0.0) -> None:
        self.kv = kv
        self.fleet = fleet
        self.load_poll_interval = load_poll_interval
        #: Engine id → its running (or, before `run`, due) subscription.
        self._subscriptions: dict[str, _Subscription] = {}
        #: `run`'s nursery while it runs: where the subscriptions of engines that join later run.
        self._nursery: trio.Nursery | None = None
        for engine in fleet.engines:
            self._subscribe(engine, kv.add_engine(engine.id, engine.card))

    @property
    def subscribers(self) -> list[Subscriber]:
        return [subscription.subscriber for subscription in self._subscriptions.values()]

    def _subscribe(self, engine: Engine, sink: IndexSink | None) -> None:
        if sink is None:
            return
        subscription = _Subscription(_subscriber(engine, sink), sink)
        self._subscriptions[engine.id] = subscription
        if self._nursery is not None:
            self._nursery.start_soon(subscription.run)

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

    def engine_joined(self, engine: Engine) -> None:
        """An engine joined the fleet after start-up: index it and follow its KV events."""
        self._subscribe(engine, self.kv.add_engine(engine.id, engine.card))

    def engine_changed(self, engine: Engine, old: EngineCard) -> None:
        """`engine` came back with a card other than `old`: follow its KV events where they are now."""
        new = engine.card
        if not self.kv.feeds_changed(old, new):
            return
        stopped = self._subscriptions.pop(engine.id, None)
        if stopped is not None:
            stopped.sink.retired = True
            stopped.scope.cancel()
        sink = self.kv.engine_changed(engine.id, old, new)
        self._subscribe(engine, sink)
        if self.kv.index is not None:
            log.info(
                "engine %s came back with KV events at %s (was %s; %s, DP size %d, page %d): %s",
                engine.id, _endpoints(new), _endpoints(old), new.role, new.dp_size, page_size(new),
                "re-subscribed" if sink is not None else "routed by load only",
            )  # fmt: skip

    def engine_left(self, engine: Engine) -> None:
        """`engine` left the fleet for good: stop following its KV events, and drop its index
        entries and its load."""
        subscription = self._subscriptions.pop(engine.id, None)
        if subscription is not None:
            subscription.sink.retired = True
            subscription.scope.cancel()
        self.kv.engine_left(engine.id, engine.card)

    def engine_down(self, engine: Engine) -> None:
        """Forget what `engine` caches (its events stopped being trustworthy) and its load."""
        subscription = self._subscriptions.get(engine.id)
        if subscription is not None:
            subscription.subscriber.engine_down()
        self.kv.engine_down(engine.id, engine.card)

    async def _poll_load(self) -> None:
        async with aclosing(
            trio_util.periodic(self.load_poll_interval)
        ) as ticks:  # closed on cancellation, not by the GC
            async for _ in ticks:
                for engine in list(self.fleet.engines):  # engines may join while a poll awaits
                    if not engine.healthy:
                        continue
                    own = self.kv.own_load(engine.id, engine.card)  # what the poll will include
                    try:
                        loads = await engine.client.load(timeout=min(self.load_poll_interval, 5.0))
                    except EngineError as error:
                        log.debug("GetLoad on %s failed: %s", engine.id, error)
                        continue
                    self.kv.apply_load(engine.id, engine.card, loads, own)

    def stats(self) -> dict:
        return {**self.kv.stats(), "subscribers": {s.engine: s.counters.as_dict() for s in self.subscribers}}


def _endpoints(card: EngineCard) -> str:
    return ", ".join(source.endpoint for source in card.kv_events) or "none"
