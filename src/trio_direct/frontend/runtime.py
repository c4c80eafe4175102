"""What requests are served from, and the task that sets it up and keeps it alive.

A `Frontend` is the process's view: its settings, the `ModelPool` of each served model, the fleet's
`Membership` (every engine of every source) and the shutdown state every open response watches
(`cutter`). A `ModelPool` is one model's engines, routing and text pipeline (tokenizer, chat
template, parsers). `FleetPools` opens a pool when the first engine of a new model joins and closes
it when its last engine left; each pool's tasks (KV feeds, health checks) run in a nursery of its
own inside `run_frontend`'s.

`run_frontend` opens the asyncio loop the engine transport needs, starts built-in mock engines when
no engine is named, probes the engines given on the command line and opens their models' pools,
starts the discovery sources (DNS, SRV, a file), then reports a `Frontend` and holds everything
open until cancelled. Both entry points use it: `trio-direct serve` (which runs hypercorn beside it)
and `hypercorn trio_direct.app:app` (whose lifespan starts it).
"""

from __future__ import annotations

import gc
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import trio

from trio_direct import metrics, tracing
from trio_direct.config import ServeConfig, routing_settings
from trio_direct.core.render import StreamCutter
from trio_direct.core.watch import StreamWatch
from trio_direct.engine.errors import EngineError
from trio_direct.engine.transport import ChannelPool, client_config, open_asyncio_loop
from trio_direct.engine.types import EngineClient
from trio_direct.fleet.card import EngineCard
from trio_direct.fleet.discovery import EngineIds, EngineSpec
from trio_direct.fleet.fleet import Engine, Fleet, FleetError, FleetModel, Worker, fleet_model, probe_fleet
from trio_direct.fleet.health import EngineHealth
from trio_direct.fleet.membership import Member, Membership
from trio_direct.fleet.pool_settings import PoolSettings
from trio_direct.fleet.probe import ProbedEngine
from trio_direct.fleet.shared_admin import SharedAdmin
from trio_direct.fleet.sources import (
    DnsResolver,
    DnsSource,
    EngineSource,
    FileSource,
    SrvSource,
    parse_dns_target,
    parse_nameserver,
    run_source,
)
from trio_direct.fleet.tokenizer_source import TokenizerNotFound, locate_tokenizer
from trio_direct.frontend.gc_policy import run_gc_policy
from trio_direct.frontend.loop_lag import monitor_loop_lag
from trio_direct.kv_sync.feeds import KvFeeds
from trio_direct.kv_sync.load_poll import poll_loads
from trio_direct.mock import MOCK_MODEL_NAME  # the built-in mocks' model name (light: no mock engine loaded)
from trio_direct.openai import errors
from trio_direct.openai.requests import warm_up_request_decoding
from trio_direct.parsers.selection import ParserSelection, select_parsers
from trio_direct.routing.affinity import SessionAffinity
from trio_direct.routing.block_hash import RoutingKey
from trio_direct.routing.busy import UNLIMITED, BusyThreshold, EngineLoads
from trio_direct.routing.kv_routing import KvRouting
from trio_direct.routing.policies import routing_policy
from trio_direct.routing.policy import Candidates, Route, RoutingPolicy
from trio_direct.state.memory import MemoryStore
from trio_direct.state.store import (
    StateStore,
    StoreSettings,
    StoreUnavailable,
    UnknownStore,
    check_url,
    open_state_store,
)
from trio_direct.tenants import access as tenant_access
from trio_direct.text.chat_template import ChatTemplateError, load_chat_template, render_chat
from trio_direct.text.harmony import harmony_encoding, is_harmony_model
from trio_direct.text.tokenizer import ModelTokenizer, TokenizerLoadError

log = logging.getLogger(__name__)


class Frontend:
    """The process's serving state: settings, the served models' pools, and shutdown.

    The pools change at runtime: a pool opens when the first engine of a new model joins and closes
    when its last engine left (`FleetPools`); `membership` is every engine of every source.
    """

    def __init__(
        self,
        config: ServeConfig,
        pools: Sequence[ModelPool] = (),
        membership: Membership | None = None,
        state: StateStore | None = None,
    ) -> None:
        self.config = config
        self._pools = {pool.name: pool for pool in pools}
        self.membership = membership
        #: Ends every open response at the drain deadline, each with its surface's error event.
        self.cutter = StreamCutter()
        #: Set once a shutdown began: readiness (`/health`) answers 503 so load balancers move on.
        self.draining = False
        #: The admin API's engine changes, recorded in `state` and followed from it (set by `run_frontend`).
        self.shared_admin: SharedAdmin | None = None
        #: What this frontend shares with every other on the same `--state-store`: stored responses,
        #: conversations, the admin API's engines (`state.store`).
        self.state: StateStore = state if state is not None else MemoryStore(store_settings(config))

    def pools(self) -> list[ModelPool]:
        return list(self._pools.values())

    def pool(self, model: str) -> ModelPool:
        """The pool serving `model`; an OpenAI 404 for a model nobody serves, or one the current
        request's tenant may not use."""
        pool = self._pools.get(model)
        if pool is None or not tenant_access.may_use(model):  # a model a tenant may not use: as if absent
            if not self._pools:  # nothing is served yet (or any more): worth retrying, not a wrong name
                raise errors.service_unavailable("No engine is serving yet; retry shortly.")
            raise errors.model_not_found(model)
        return pool

    def pool_or_only(self, model: str | None) -> ModelPool:
        """`pool(model)`; without a model, the one model served (a 400 naming them when several are)."""
        if model is not None:
            return self.pool(model)
        if len(self._pools) == 1:
            return self.pool(next(iter(self._pools)))  # the tenant's permission still applies
        if not self._pools:
            raise errors.service_unavailable("No engine is serving yet; retry shortly.")
        names = ", ".join(sorted(self._pools))
        raise errors.invalid_request(
            f"'model' is required: this server serves several models ({names}).", param="model"
        )

    def find_pool(self, model: str) -> ModelPool | None:
        return self._pools.get(model)

    def add_pool(self, pool: ModelPool) -> None:
        self._pools[pool.name] = pool

    def remove_pool(self, pool: ModelPool) -> None:
        if self._pools.get(pool.name) is pool:
            del self._pools[pool.name]

    def healthy(self) -> bool:
        """Ready: not draining, and some model has an engine that can take requests."""
        return not self.draining and any(pool.healthy() for pool in self._pools.values())

    def waiting_engines(self) -> list[tuple[str, str, str]]:
        """(model or "", id, URL) of engines in no pool yet: not up, or refused (for `/metrics`)."""
        if self.membership is None:
            return []
        return [(m.model or "", m.id, m.url) for m in self.membership.waiting()]

    def engine_report(self) -> list[dict]:
        """Every engine as `GET /admin/engines` shows it."""
        if self.membership is None:
            return []
        return [self._report(member) for member in self.membership.members()]

    def _report(self, member: Member) -> dict:
        engine = member.engine
        pool = self._pools.get(member.pool) if member.pool is not None else None
        in_flight, kv_blocks = 0, None
        if engine is not None:
            client_channel = getattr(engine.client, "channel", None)
            in_flight = client_channel.streams_in_flight if client_channel is not None else 0
            if pool is not None and pool.routing.kv is not None and pool.routing.kv.index is not None:
                kv_blocks = pool.routing.kv.held_blocks(engine.id, engine.card)
        return {
            "id": member.id,
            "url": member.url,
            "sources": sorted(member.sources),
            "model": member.model,
            "role": engine.card.role if engine is not None else member.spec.role,
            "state": member.state,
            "healthy": bool(engine is not None and engine.healthy and member.state == "serving"),
            "in_flight": in_flight,
            "kv_index_blocks": kv_blocks,
            "reason": member.reason or None,
        }


@dataclass(slots=True, eq=False)
class ModelPool:
    """One served model: its engines (fleet), routing, and text pipeline."""

    config: ServeConfig
    fleet: Fleet
    routing: RoutingPolicy
    tokenizer: ModelTokenizer
    #: The `--chat-template` file's text; None = the model's own templates.
    chat_template_override: str | None
    #: The tool-call and reasoning parsers this model's output is read with (`select_model_parsers`).
    parsers: ParserSelection = field(default_factory=lambda: ParserSelection(None, None))
    #: A gpt-oss model: prompts are written in harmony by openai-harmony's encoder.
    harmony: bool = False
    #: `--router-mode kv`, `least-load`, `power-of-two`: the KV-event subscriptions (kv) and the
    #: load polling that feed `routing.kv`.
    kv_feeds: KvFeeds | None = None
    health: EngineHealth | None = None
    #: Engines that may join this pool but are not up yet (or refused), for `GET /debug/routing`.
    waiting: Callable[[], Sequence[Any]] = tuple
    #: Told when health checks take an engine out (the fleet's membership lets some leave then).
    on_engine_down: Callable[[Engine], None] | None = None
    #: The model directory's `config.json` (`hidden_size`, Matryoshka dimensions of an embedding model).
    model_config: Mapping[str, Any] = field(default_factory=dict)
    #: `--engine-busy-threshold`: polled and own load per worker, and which workers are busy.
    busy: EngineLoads | None = None
    #: The frontend's watch over open streams and engine calls (keep-alives, hung engines), one
    #: for every pool.
    watch: StreamWatch | None = None
    _token_texts: dict[int, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """The model name clients send (`--served-model-name`, else the engines')."""
        return self.fleet.model.served_model_name

    def token_text(self, token_id: int) -> str:
        """One token's text, as logprobs show it (cached: the same ids recur constantly)."""
        text = self._token_texts.get(token_id)
        if text is None:
            if len(self._token_texts) > 200_000:
                self._token_texts.clear()
            text = self._token_texts[token_id] = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return text

    @property
    def context_length(self) -> int | None:
        return self.fleet.model.context_length

    @property
    def is_embedding(self) -> bool:
        """The engines serve an embedding model: `/v1/embeddings` only, no generation."""
        return self.fleet.model.is_embedding

    @property
    def supports_images(self) -> bool:
        """Every engine takes image input (`image_data`)."""
        return self.fleet.model.supports_images

    @property
    def tool_call_parser(self) -> str | None:
        return self.parsers.tool_call_parser

    @property
    def reasoning_parser(self) -> str | None:
        return self.parsers.reasoning_parser

    @property
    def disaggregated(self) -> bool:
        """Prefill engines are configured: requests are served as prefill + decode pairs."""
        return any(engine.card.role == "prefill" for engine in self.fleet.engines)

    def candidates(self) -> Candidates[Worker]:
        """The healthy workers of each role, as routing sees them."""
        workers = self.fleet.workers()
        aggregated: Sequence[Worker] = [w for w in workers if w.engine.card.role == "aggregated"]
        prefill: Sequence[Worker] = self.fleet.prefill_workers()
        decode: Sequence[Worker] = [w for w in workers if w.engine.card.role == "decode"]
        busy = self.busy
        if busy is not None:  # busy workers get nothing new while another is not busy
            aggregated = busy.prefer_idle(aggregated, routing_key)
            prefill = busy.prefer_idle(prefill, routing_key)
            decode = busy.prefer_idle(decode, routing_key)
        return Candidates(
            aggregated, prefill, decode, key=routing_key, disaggregated=self.disaggregated, name=worker_name
        )

    def healthy(self) -> bool:
        return self.routing.can_route(self.candidates())

    def choose_route(
        self, token_ids: Sequence[int] = (), request_id: str | None = None, session_key: str | None = None
    ) -> Route[Worker]:
        """Where a request goes (`RoutingPolicy.choose`); raises `NoWorkerAvailable` when nothing
        healthy can serve it. A route chosen with a `request_id` counts as load until `release`.

        `session_key`: the request's ``X-Session-ID`` header, else (with
        `--router-affinity-from-user`) its ``user`` field: see `session_key`."""
        route = self.routing.choose(self.candidates(), token_ids, request_id, session_key)
        if self.busy is not None and request_id is not None:
            self.busy.routed(request_id, [routing_key(w) for w in (route.prefill, route.decode) if w is not None])
        return route

    def headroom(self) -> int:
        """How many more requests the engines take before every one that could serve is busy
        (`--engine-busy-threshold`; without one, or with no engine up at all, no limit: dispatch
        then answers for itself)."""
        busy = self.busy
        if busy is None:
            return UNLIMITED
        fleet = self.fleet
        workers = fleet.workers()
        aggregated = [w for w in workers if w.engine.card.role == "aggregated"]
        decode = [w for w in workers if w.engine.card.role == "decode"]
        prefill = fleet.prefill_workers()
        if self.disaggregated and prefill and decode:
            # A decode engine at its threshold is not paired: no prefill starts for it.
            return min(busy.headroom(prefill, routing_key), busy.headroom(decode, routing_key))
        if not aggregated:
            return UNLIMITED
        return busy.headroom(aggregated, routing_key)

    def on_load_change(self, listener: Callable[[], None]) -> None:
        """Call `listener` after every round of load polls (admission re-checks its waiters)."""
        if self.busy is not None:
            self.busy.listeners.append(listener)

    def apply_load(self, engine: Engine, loads: list[dict]) -> None:
        """An engine's `GetLoad` answer, per DP rank (`--engine-busy-threshold`)."""
        if self.busy is None:
            return
        for load in loads:
            rank = load.get("dp_rank")
            key = RoutingKey(engine.id, rank if engine.card.dp_size > 1 else None)
            self.busy.apply_poll(key, load)

    def session_key(self, header: str | None, user: object = None) -> str | None:
        """The session key of a request, from its ``X-Session-ID`` header value and its body's
        ``user`` field (used only with `--router-affinity-from-user`); ``None``: no affinity."""
        return session_key(header, user, from_user=self.config.router_affinity_from_user)

    def explain_route(self, token_ids: Sequence[int] | None = None) -> dict:
        """What `GET/POST /debug/routing` shows: the mode, the workers, and in kv mode the index
        state and, for a prompt, every candidate's overlap, load and cost (nothing is recorded)."""
        workers = self.fleet.workers() + self.fleet.prefill_workers()
        report: dict = {
            "router_mode": self.config.router_mode,
            "disaggregated": self.disaggregated,
            "workers": [
                {"engine": w.engine.id, "url": w.engine.card.url, "role": w.engine.card.role, "dp_rank": w.dp_rank}
                for w in workers
            ],
            # Not up yet (or refused): never routed to; they join when a probe works and they agree.
            "pending": [
                {"engine": p.id, "url": p.url, "reason": p.reason} for p in [*self.fleet.pending, *self.waiting()]
            ],
        }
        if self.fleet.draining:
            report["draining"] = [{"engine": e.id, "url": e.card.url} for e in self.fleet.draining]
        if self.kv_feeds is not None:
            report["kv"] = self.kv_feeds.stats()
            if token_ids is not None:
                report["prompt_tokens"] = len(token_ids)
                report["route"] = route_json(self.choose_route(token_ids, None))
        return report

    def engine_unreachable(self, client: EngineClient, error: EngineError) -> None:
        """A request could not reach an engine: routing skips it until a health check passes."""
        for engine in self.fleet.engines:
            if engine.client is client and self.health is not None:
                self.health.unreachable(engine, str(error))

    def check_join(self, engine: Engine) -> None:
        """The frontend's rules for an engine joining after start-up (`FleetError` refuses it)."""
        check_role(engine, self.config.prefill_engine_url)
        if self.routing.kv is not None:
            try:
                self.routing.kv.check_join(engine.card)
            except ValueError as error:
                raise FleetError(str(error)) from None

    def engine_joined(self, engine: Engine) -> None:
        """What an engine joining means beyond routing: in kv mode, index it and follow its events."""
        if self.kv_feeds is not None:
            self.kv_feeds.engine_joined(engine)

    def engine_changed(self, engine: Engine, old_card: EngineCard) -> None:
        """An engine came back with another card: in kv mode, follow its KV events where they are now."""
        if self.kv_feeds is not None:
            self.kv_feeds.engine_changed(engine, old_card)

    def engine_down(self, engine: Engine) -> None:
        """What an engine going down means beyond routing: its KV index entries are stale."""
        if self.kv_feeds is not None:
            self.kv_feeds.engine_down(engine)
        self._forget_load(engine)
        if self.on_engine_down is not None:
            self.on_engine_down(engine)

    def engine_left(self, engine: Engine) -> None:
        """A drained engine left for good: its KV index entries, load and metric series go."""
        if self.kv_feeds is not None:
            self.kv_feeds.engine_left(engine)
        self._forget_load(engine)
        metrics.forget_engine(engine.id)

    def _forget_load(self, engine: Engine) -> None:
        if self.busy is not None:
            for rank in range(engine.card.dp_size) if engine.card.dp_size > 1 else (None,):
                self.busy.forget(RoutingKey(engine.id, rank))

    def first_token(self, request_id: str) -> None:
        """The request's first output arrived: its prefill no longer loads its engine."""
        self.routing.first_token(request_id)
        if self.busy is not None:
            self.busy.first_token(request_id)

    def release(self, request_id: str) -> None:
        """The request ended (completion, abort or error): its load leaves its engines."""
        self.routing.release(request_id)
        if self.busy is not None:
            self.busy.released(request_id)


def _busy_threshold(config: ServeConfig) -> BusyThreshold | None:
    try:
        return BusyThreshold.parse(config.engine_busy_threshold)
    except ValueError as error:
        raise FleetError(f"--engine-busy-threshold: {error}") from None


def read_model_config(directory: Path) -> dict[str, Any]:
    """The model directory's `config.json`; {} when it has none (a tokenizer-only directory)."""
    try:
        value = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def store_settings(config: ServeConfig) -> StoreSettings:
    """The state store's settings from the `--state-store-*` flags (and, for `memory`, the bounds
    of `--responses-store-max-items` and `--responses-store-max-bytes`)."""
    return StoreSettings(
        ttl=config.state_store_ttl,
        max_entry_bytes=config.state_store_max_entry_bytes,
        timeout=config.state_store_timeout,
        memory_max_bytes=config.responses_store_max_bytes,
        memory_max_entries=config.responses_store_max_items,
    )


def routing_key(worker: Worker) -> RoutingKey:
    return RoutingKey(worker.engine.id, worker.dp_rank)


def worker_name(worker: Worker) -> str:
    """A worker as every frontend names it (engine ids are each frontend's own): address and rank."""
    card = worker.engine.card
    return f"{card.host.lower()}:{card.port}/{worker.dp_rank}"


#: Longest session key kept; longer ones are used by their first characters only.
MAX_SESSION_KEY = 256


def session_key(header: str | None, user: object = None, *, from_user: bool = False) -> str | None:
    """A request's session key: the header's value, else the ``user`` field when `from_user`.

    Blank values are no key; keys are cut to `MAX_SESSION_KEY` characters so a client cannot
    grow the affinity table's memory by its key's length."""
    for value, wanted in ((header, True), (user, from_user)):
        if wanted and isinstance(value, str) and value.strip():
            return value.strip()[:MAX_SESSION_KEY]
    return None


def route_json(route: Route[Worker]) -> dict:
    """A route as `GET /debug/routing` shows it."""

    def worker(w: Worker | None) -> dict | None:
        return None if w is None else {"engine": w.engine.id, "url": w.engine.card.url, "dp_rank": w.dp_rank}

    return {
        "decode" if route.prefill else "engine": worker(route.decode),
        **({"prefill": worker(route.prefill)} if route.prefill else {}),
        "decision": route.decision.to_json() if route.decision else None,
        **({"decode_decision": route.decode_decision.to_json()} if route.decode_decision else {}),
    }


def select_model_parsers(config: ServeConfig, model: FleetModel) -> ParserSelection:
    """The parsers of a served model: the flag, else what the engines report, else the model's name
    as smg's factory maps it. An unknown flag value stops start-up, listing every known name."""
    try:
        selection = select_parsers(
            tool_call_flag=config.tool_call_parser,
            reasoning_flag=config.reasoning_parser,
            engine_tool_call_parser=model.tool_call_parser,
            engine_reasoning_parser=model.reasoning_parser,
            model_path=model.model_path,
            served_model_name=model.served_model_name,
        )
    except ValueError as error:  # UnknownToolCallParser, UnknownReasoningParser
        raise FleetError(str(error)) from None
    for warning in selection.warnings:
        log.warning("model %r: %s", model.served_model_name, warning)
    for kind, name, source in (
        ("tool-call", selection.tool_call_parser, selection.tool_call_source),
        ("reasoning", selection.reasoning_parser, selection.reasoning_source),
    ):
        if name is not None:
            log.info("model %r: %s parser %s (%s)", model.served_model_name, kind, name, source)
    return selection


def check_roles(fleet: Fleet, prefill_urls: list[str]) -> None:
    """Roles come from the probe: every engine serves in the role it reports, whichever flag gave
    it. `--prefill-engine-url` only adds an assertion: the engines it names must be prefill engines."""
    for engine in fleet.engines:
        check_role(engine, prefill_urls)


def check_role(engine: Engine, prefill_urls: list[str]) -> None:
    """`check_roles` for one engine (also run when an engine joins after start-up)."""
    if engine.card.url in prefill_urls and engine.card.role != "prefill":
        raise FleetError(
            f"engine {engine.id} ({engine.card.url}) was given with --prefill-engine-url, but reports role "
            f"{engine.card.role!r} (disaggregation_mode), not 'prefill'; give it with --engine-url, where every "
            "engine serves in the role it reports"
        )


async def start_mock_engines(count: int, speedup: float, nursery: trio.Nursery) -> list[str]:
    """Built-in CPU mock engines on ephemeral loopback ports, for trying trio-direct without a GPU."""
    from trio_direct.mock.server import MockEngineConfig, run_mock_engine

    urls = []
    for index in range(count):
        config = MockEngineConfig(
            speedup=speedup, incremental_streaming_output=True, seed=index, served_model_name=MOCK_MODEL_NAME
        )
        running = await nursery.start(run_mock_engine, config)
        urls.append(f"grpc://{running.host}:{running.port}")
    log.info("no --engine-url given: serving %d built-in mock engines at %s", count, ", ".join(urls))
    return urls


def _warm_up_request_path(frontend: ModelPool) -> None:
    """Do once, before the first request, what the first request would otherwise wait for.

    Jinja compiles a model's template in ~10 ms, msgspec builds its validators for the request
    types in ~1 ms, and openai-harmony loads gpt-oss's encoding in ~0.35 s; done here, these are
    also among what start-up keeps out of the cyclic GC.
    """
    warm_up_request_decoding()
    if frontend.harmony:
        harmony_encoding()
    text = "Hello"
    try:
        messages = [{"role": "user", "content": text}]
        text = render_chat(frontend.tokenizer, messages, chat_template=frontend.chat_template_override)
    except ChatTemplateError:
        pass  # no template, or one that wants other messages: each request reports it as before
    frontend.tokenizer.encode(text, add_special_tokens=False)


async def _connect_for_generation(engines: Sequence[Engine]) -> None:
    """Open each engine's connection for generations now: the first request to an engine would
    otherwise wait for the TCP connect and the engine's HTTP/2 settings (5-10 ms on loopback).

    An engine that cannot be reached now is connected by its first request, as before; one that
    joins later too.
    """

    async def connect(engine: Engine) -> None:
        try:
            await engine.client.connect()
        except EngineError as error:
            log.info("engine %s: not connected ahead (%s); its first request will connect", engine.id, error)

    async with trio.open_nursery() as nursery:
        for engine in engines:
            nursery.start_soon(connect, engine)


async def open_model_pool(
    config: ServeConfig,
    fleet: Fleet,
    channels: ChannelPool,
    chat_template: str | None,
    *,
    on_engine_down: Callable[[Engine], None] | None = None,
    watch: StreamWatch | None = None,
) -> ModelPool:
    """One model's pool for `fleet`: its tokenizer (loaded in a worker thread), template, parsers,
    routing and, per the settings, KV feeds and health checks (not running yet: `run_model_pool`).

    Raises `FleetError` when the tokenizer cannot be loaded or the engines do not fit KV routing.
    """
    model = fleet.model
    try:
        source = await locate_tokenizer(model.served_model_name, model.tokenizer_path, fleet.engines)
    except TokenizerNotFound as error:
        raise FleetError(str(error)) from None
    except TokenizerLoadError as error:
        raise FleetError(f"model {model.served_model_name!r}: {error} (give --model-path)") from None
    tokenizer = source.tokenizer
    kv = None
    settings = routing_settings(config)
    if routing_policy(settings.mode).load_aware:
        try:
            kv = KvRouting([engine.card for engine in fleet.engines], settings)
        except ValueError as error:
            raise FleetError(str(error)) from None
    affinity = SessionAffinity(config.router_session_ttl) if config.router_session_ttl > 0 else None
    routing = RoutingPolicy(config.router_mode, enforce_disagg=config.enforce_disagg, kv=kv, affinity=affinity)
    harmony = is_harmony_model(model.model_path, model.served_model_name)
    pool = ModelPool(
        config, fleet, routing, tokenizer, chat_template, select_model_parsers(config, model), harmony,
        on_engine_down=on_engine_down,
    )  # fmt: skip
    pool.model_config = await trio.to_thread.run_sync(read_model_config, source.directory)
    pool.watch = watch
    threshold = _busy_threshold(config)
    if threshold is not None:
        pool.busy = EngineLoads(threshold)
    # KV routing before health checking: an engine that joins is indexed at once. One GetLoad poll
    # feeds both KV routing and the busy threshold when both want it (`run_model_pool`).
    if kv is not None:
        kv_polls = config.load_poll_interval if pool.busy is None else 0.0
        pool.kv_feeds = KvFeeds(kv, fleet, load_poll_interval=kv_polls)
    if config.health_interval > 0:
        pool.health = EngineHealth(
            fleet,
            channels,
            interval=config.health_interval,
            timeout=config.health_timeout,
            api=config.engine_api,
            on_down=pool.engine_down,
            check_join=pool.check_join,
            on_join=pool.engine_joined,
            on_change=pool.engine_changed,
            calls=watch,
        )
    await trio.to_thread.run_sync(_warm_up_request_path, pool)
    return pool


async def run_model_pool(
    pool: ModelPool, scope: trio.CancelScope, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    """Run a pool's own tasks (KV feeds, health checks) until `scope` is cancelled (its last engine
    left) or the frontend stops."""
    with scope:
        async with trio.open_nursery() as nursery:
            if pool.kv_feeds is not None:
                await nursery.start(pool.kv_feeds.run)
                log.info("model %r: %s routing: %s", pool.name, pool.config.router_mode, pool.kv_feeds.stats())
            busy = pool.busy
            if busy is not None:
                kv = pool.routing.kv
                consumers = [pool.apply_load]
                if kv is not None:
                    consumers.append(lambda engine, loads: kv.apply_load(engine.id, engine.card, loads))
                interval = pool.config.load_poll_interval or 1.0
                nursery.start_soon(poll_loads, pool.fleet, interval, consumers, busy.polled)
                log.info("model %r: engines count as busy at %s (GetLoad every %gs)",
                         pool.name, busy.threshold.describe(), interval)  # fmt: skip
            if pool.health is not None:
                await nursery.start(pool.health.run)
            task_status.started()


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
        await _connect_for_generation(engines)
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
                await _connect_for_generation([engine])
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


def engine_sources(config: ServeConfig) -> list[EngineSource]:
    """The discovery sources the settings name (`FleetError` for a malformed one)."""
    try:
        nameserver = parse_nameserver(config.discovery_nameserver) if config.discovery_nameserver else None
        resolver = DnsResolver(nameserver, timeout=max(1.0, min(5.0, config.discovery_interval)))
        sources: list[EngineSource] = [DnsSource(*parse_dns_target(name), resolver) for name in config.engine_dns]
    except ValueError as error:
        raise FleetError(str(error)) from None
    sources += [SrvSource(name, resolver) for name in config.engine_dns_srv]
    if config.engine_file:
        sources.append(FileSource(config.engine_file))
    return sources


def has_engine_sources(config: ServeConfig) -> bool:
    """Whether any engine is named (else `serve` runs built-in mock engines)."""
    return bool(
        config.engine_url
        or config.prefill_engine_url
        or config.engine_dns
        or config.engine_dns_srv
        or config.engine_file
    )


async def run_frontend(
    config: ServeConfig, *, task_status: trio.TaskStatus[Frontend] = trio.TASK_STATUS_IGNORED
) -> None:
    """Start the fleet and its pools, report the `Frontend`, and keep everything running until cancelled.

    Engines given with `--engine-url`/`--prefill-engine-url` are probed first and start-up waits for
    them as it always did (`probe_fleet`); the discovery sources are then asked once, and start-up
    waits (at most `--engine-wait-timeout`) for a first probe of every engine they named.
    """
    async with open_asyncio_loop(), trio.open_nursery() as nursery:
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
