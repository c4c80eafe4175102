"""Load-aware routing state of one fleet (the policies of `policies` with a `selection`), without I/O.

One `KvIndex` for the fleet, fed per engine and DP rank with the engines' own KV events (the
subscriptions are the I/O shell's, `kv_sync.feeds`), and two `KvRouter`s: the aggregated (or
prefill) pool is weighed by prefix overlap and load, the decode pool of a disaggregated fleet by
load alone (decode engines hold no prefix another request can reuse).

- The index works at a routing block of ``--kv-cache-block-size`` tokens (16 by default, a
  multiple of every engine's page size), so a page-size-1 engine costs no more per event or per
  decision than a page-16 one.
- Engines that publish no events are routed by load alone, or, with ``--no-router-kv-events``,
  from an approximate index of this frontend's own decisions (TTL ``--router-ttl-secs``).
- Load is tracked from dispatch (`ActiveSequences`), released at the first token and at the end,
  and corrected from the engines' `GetLoad` (`apply_load`), which is how load from other
  frontends (replicas, `--workers` siblings) is learnt.
- The cost's weights come from a preset (`--router-preset`): ``ttft`` by default, which weighs
  the prefill work ahead of a request (what delays its first token) ten times a decode block,
  or ``dynamo``, Dynamo's default 1:1 cost. Flags given explicitly override the preset.
- `least-load` and `power-of-two` use the same load and bookkeeping with no index at all.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from trio_direct.fleet.card import EngineCard
from trio_direct.routing.active_sequences import OwnLoad
from trio_direct.routing.block_hash import RoutingKey
from trio_direct.routing.kv_index import KvIndex
from trio_direct.routing.kv_router import Decision, KvRouter, KvRouterConfig
from trio_direct.routing.policies import RoutingSettings, routing_policy

__all__ = [
    "DEFAULT_ROUTING_BLOCK",
    "PRESETS",
    "CostPreset",
    "IndexSink",
    "LoadAwareRouting",
    "cost_settings",
    "page_size",
    "routing_block_size",
    "routing_keys",
]

log = logging.getLogger(__name__)

DEFAULT_ROUTING_BLOCK = 16

W = TypeVar("W")


@dataclass(frozen=True, slots=True)
class CostPreset:
    """The KV cost's weights (see `KvRouterConfig`)."""

    overlap_score_credit: float
    prefill_load_scale: float
    temperature: float


#: `--router-preset`. ``ttft`` was chosen by the sweep in benchmarks/README.md ("KV routing
#: defaults"); ``dynamo`` is Dynamo's own default cost.
PRESETS = {
    "ttft": CostPreset(overlap_score_credit=1.0, prefill_load_scale=10.0, temperature=0.0),
    "dynamo": CostPreset(overlap_score_credit=1.0, prefill_load_scale=1.0, temperature=0.0),
}


def cost_settings(settings: RoutingSettings) -> CostPreset:
    """The preset's weights, with each flag given explicitly taking its place."""
    preset = PRESETS[settings.preset]

    def given(value: float | None, default: float) -> float:
        return default if value is None else value

    return CostPreset(
        given(settings.overlap_score_credit, preset.overlap_score_credit),
        given(settings.prefill_load_scale, preset.prefill_load_scale),
        given(settings.temperature, preset.temperature),
    )


def page_size(card: EngineCard) -> int:
    return card.kv_block_size or card.block_size or 1


def routing_block_size(cards: Iterable[EngineCard], configured: int | None) -> int:
    """The routing block: the flag, else the smallest multiple of every page size that is >= 16."""
    pages = {page_size(card) for card in cards}
    if configured is not None:
        bad = sorted(p for p in pages if configured % p)
        if bad:
            raise ValueError(f"--kv-cache-block-size {configured} is not a multiple of the engines' page size {bad[0]}")
        return configured
    block = math.lcm(*pages) if pages else 1
    return block * math.ceil(DEFAULT_ROUTING_BLOCK / block)


def routing_keys(engine_id: str, card: EngineCard) -> list[RoutingKey]:
    """The routing keys of an engine with `card`: one, or one per DP rank."""
    ranks: list[int | None] = [None] if card.dp_size <= 1 else list(range(card.dp_size))
    return [RoutingKey(engine_id, rank) for rank in ranks]


class IndexSink:
    """Feeds one engine's KV events into the index, per DP rank (what a subscriber calls)."""

    __slots__ = ("_engine_id", "_index", "_single_rank", "retired")

    def __init__(self, index: KvIndex, engine_id: str, card: EngineCard) -> None:
        self._index = index
        self._engine_id = engine_id
        self._single_rank = card.dp_size <= 1
        #: Set when the subscription is replaced: a batch its cancelled task was already handed
        #: comes from the old endpoints (or DP layout) and must not reach the index.
        self.retired = False

    def _key(self, dp_rank: int) -> RoutingKey:
        return RoutingKey(self._engine_id, None if self._single_rank else dp_rank)

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


class LoadAwareRouting:
    """The index and the routers of one fleet, kept in step with the engines that come and go.

    The routing block is fixed at construction from the engines' page sizes (`cards`); each engine
    is then added with `add_engine`, and later ones must fit that block (`check_join`). Raises
    `ValueError` for a policy that is not load-aware (or unknown) and for engines that do not fit.
    """

    def __init__(self, cards: Iterable[EngineCard], settings: RoutingSettings) -> None:
        kind = routing_policy(settings.mode)
        if kind.selection is None:
            raise ValueError(f"router mode {kind.name!r} is not load-aware")
        self.mode = kind.name
        self.selection = kind.selection
        self.block_size = routing_block_size(cards, settings.kv_cache_block_size)
        self.use_events = settings.kv_events and self.selection == "cost"
        self.index = KvIndex(self.block_size) if self.use_events else None
        self.busy_threshold = settings.session_busy_fraction
        self.cost = cost_settings(settings)
        router_config = KvRouterConfig(
            overlap_score_credit=self.cost.overlap_score_credit,
            prefill_load_scale=self.cost.prefill_load_scale,
            temperature=self.cost.temperature,
            use_kv_events=self.use_events,
            ttl_secs=settings.ttl_secs,
            block_size=self.block_size,
            selection=self.selection,
        )
        self.router = KvRouter(router_config, self.index)
        # Decode engines of a disaggregated fleet hold no reusable prefix: load alone decides.
        load_only = KvRouterConfig(overlap_score_credit=0.0, block_size=self.block_size, use_kv_events=False)
        self.decode_router = KvRouter(load_only)

    # ---- engines coming and going -------------------------------------------------------------------

    def check_join(self, card: EngineCard) -> None:
        """Raise `ValueError` if an engine with `card` cannot be indexed at this fleet's routing block."""
        if self.index is not None and card.role != "decode" and self.block_size % page_size(card):
            raise ValueError(
                f"its page size {page_size(card)} does not divide the routing block {self.block_size} "
                "(set --kv-cache-block-size to a multiple of every engine's page size)"
            )

    def add_engine(self, engine_id: str, card: EngineCard) -> IndexSink | None:
        """Register the engine's ranks in the index; the sink its KV events go to, if it publishes any."""
        if self.index is None or card.role == "decode":
            return None
        for key in routing_keys(engine_id, card):
            self.index.register_worker(key, page_size(card))
        if not card.kv_events:
            log.warning(
                "engine %s publishes no KV events: it is routed by load only (start SGLang with "
                "--kv-events-config, or run trio-direct with --no-router-kv-events)",
                engine_id,
            )
            return None
        return IndexSink(self.index, engine_id, card)

    @staticmethod
    def feeds_changed(old: EngineCard, new: EngineCard) -> bool:
        """Whether an engine back with `new` instead of `old` needs its KV events followed anew.

        Only what KV routing depends on matters (role, DP size, page size, KV-event endpoints); an
        engine back on the same endpoints keeps its subscription, which notices the publisher's
        restart by itself.
        """
        return (old.role, old.dp_size, page_size(old), old.kv_events) != (
            new.role, new.dp_size, page_size(new), new.kv_events,
        )  # fmt: skip

    def engine_changed(self, engine_id: str, old: EngineCard, new: EngineCard) -> IndexSink | None:
        """The engine came back with `new` (`feeds_changed` said so): ranks that no longer exist
        leave the index and the routers; the new card's sink, if it publishes events."""
        gone = set(routing_keys(engine_id, old)) - set(routing_keys(engine_id, new))
        for key in gone:
            if self.index is not None:
                self.index.remove_worker(key)
            self.router.remove_worker(key)
            self.decode_router.remove_worker(key)
        if self.index is None:
            return None  # approximate mode: nothing subscribed, and new ranks are learnt as they are routed
        if new.role == "decode":
            for key in routing_keys(engine_id, new):
                self.index.remove_worker(key)  # decode engines are routed by load alone
        return self.add_engine(engine_id, new)

    def engine_down(self, engine_id: str, card: EngineCard) -> None:
        """Forget what the engine caches (its events stopped being trustworthy) and its load."""
        for key in routing_keys(engine_id, card):
            if self.index is not None:
                self.index.clear_worker(key)
            self.router.remove_worker(key)
            self.decode_router.remove_worker(key)

    def engine_left(self, engine_id: str, card: EngineCard) -> None:
        """The engine left the fleet for good: its ranks leave the index and the routers."""
        for key in routing_keys(engine_id, card):
            if self.index is not None:
                self.index.remove_worker(key)
            self.router.remove_worker(key)
            self.decode_router.remove_worker(key)

    def held_blocks(self, engine_id: str, card: EngineCard) -> int:
        """Routing blocks the index holds for the engine, all its ranks together (0 without events)."""
        if self.index is None:
            return 0
        return sum(self.index.held_blocks(key) for key in routing_keys(engine_id, card))

    def own_load(self, engine_id: str, card: EngineCard) -> dict[RoutingKey, OwnLoad]:
        """This frontend's load on each of the engine's ranks now: take it as a `GetLoad` is sent."""
        router = self.decode_router if card.role == "decode" else self.router
        return {key: router.active.own_load(key) for key in routing_keys(engine_id, card)}

    def apply_load(
        self,
        engine_id: str,
        card: EngineCard,
        loads: Iterable[Mapping[str, Any]],
        own_at_poll: Mapping[RoutingKey, OwnLoad] | None = None,
    ) -> None:
        """What the engine's `GetLoad` reported, per DP rank: the load every frontend put on it.

        ``own_at_poll`` is `own_load` taken when the poll was sent (default: now).
        """
        router = self.decode_router if card.role == "decode" else self.router
        for load in loads:
            rank = load.get("dp_rank")
            key = RoutingKey(engine_id, rank if card.dp_size > 1 else None)
            try:
                router.active.set_external_load(
                    key,
                    running=_count(load.get("num_running_reqs")),
                    waiting=_count(load.get("num_waiting_reqs")),
                    used_tokens=_count(load.get("num_used_tokens")),
                    waiting_tokens=_count(load["num_waiting_uncached_tokens"])
                    if load.get("num_waiting_uncached_tokens") is not None
                    else None,
                    max_tokens=_count(load.get("max_total_num_tokens")) or None,
                    own_at_poll=own_at_poll.get(key) if own_at_poll is not None else None,
                )
            except (TypeError, ValueError):
                log.debug("GetLoad of %s: unreadable entry %r", engine_id, load)

    def busy(self, key: RoutingKey) -> bool:
        """Whether the worker's KV cache use (polled, plus own requests since) is over the threshold."""
        usage = self.router.active.kv_usage(key)
        return usage is not None and usage >= self.busy_threshold

    # ---- per request --------------------------------------------------------------------------------

    def choose(
        self,
        router: KvRouter,
        workers: Sequence[W],
        key: Callable[[W], RoutingKey],
        token_ids: Sequence[int],
        request_id: str | None,
        pinned: RoutingKey | None = None,
    ) -> tuple[W, Decision]:
        """Route (or, without a request id, only weigh) `token_ids` over `workers`; `pinned`, if
        one of them, is chosen whatever the cost (session affinity), its load counted the same."""
        by_key = {key(w): w for w in workers}
        keys = list(by_key)
        if request_id is None:
            decision = router.decide(token_ids, keys, pinned=pinned)
        else:
            decision = router.route(request_id, token_ids, keys, pinned=pinned)
            log.debug("%s", decision.explain())
        return by_key[cast(RoutingKey, decision.worker)], decision

    def first_token(self, request_id: str) -> None:
        self.router.first_token(request_id)
        self.decode_router.first_token(request_id)

    def free(self, request_id: str) -> None:
        self.router.free(request_id)
        self.decode_router.free(request_id)

    def stats(self) -> dict[str, Any]:
        return {
            "block_size": self.block_size,
            "mode": "load" if self.selection != "cost" else "events" if self.use_events else "approximate",
            "cost": {
                "overlap_score_credit": self.cost.overlap_score_credit,
                "prefill_load_scale": self.cost.prefill_load_scale,
                "temperature": self.cost.temperature,
            },
            "index": self.index.stats() if self.index is not None else None,
        }


def _count(value: Any) -> int:
    """A non-negative count from a JSON load report (an engine's own, so checked, not trusted)."""
    number = int(value or 0)
    return max(0, number)
