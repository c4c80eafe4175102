"""What requests are served from, and the task that sets it up and keeps it alive.

A `Frontend` is the process's view: its settings, the `ModelPool` of each served model, and the
shutdown state every open response watches (`cutter`). A `ModelPool` is one model's engines, routing
and text pipeline (tokenizer, chat template, parsers).

`run_frontend` opens the asyncio loop the engine transport needs, starts built-in mock engines when
no engine URL is given, probes and checks the fleet, loads the tokenizer, then reports a `Frontend`
and holds everything open until cancelled. Both entry points use it: `trio-direct serve` (which runs
hypercorn beside it) and `hypercorn trio_direct.app:app` (whose lifespan starts it).
"""

from __future__ import annotations

import gc
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import trio

from trio_direct import tracing
from trio_direct.config import ServeConfig
from trio_direct.core.render import StreamCutter
from trio_direct.core.watch import StreamWatch
from trio_direct.engine.errors import EngineError
from trio_direct.engine.transport import ChannelPool, client_config, open_asyncio_loop
from trio_direct.engine.types import EngineClient
from trio_direct.fleet.card import EngineCard
from trio_direct.fleet.fleet import Engine, Fleet, FleetError, FleetModel, FleetOverrides, Worker
from trio_direct.fleet.health import EngineHealth
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
from trio_direct.routing.kv_routing import LOAD_MODES, KvRouting
from trio_direct.routing.policy import Candidates, Route, RoutingPolicy
from trio_direct.surfaces.response_store import ResponseStore
from trio_direct.text.chat_template import ChatTemplateError, load_chat_template, render_chat
from trio_direct.text.harmony import harmony_encoding, is_harmony_model
from trio_direct.text.tokenizer import ModelTokenizer

log = logging.getLogger(__name__)


class Frontend:
    """The process's serving state: settings, the served models' pools, and shutdown."""

    def __init__(self, config: ServeConfig, pools: Sequence[ModelPool]) -> None:
        self.config = config
        self._pools = {pool.name: pool for pool in pools}
        #: Ends every open response at the drain deadline, each with its surface's error event.
        self.cutter = StreamCutter()
        #: Set once a shutdown began: readiness (`/health`) answers 503 so load balancers move on.
        self.draining = False
        #: The Responses API's stored responses (`store: true`), for `previous_response_id` and GET.
        self.responses = ResponseStore(config.responses_store_max_items, config.responses_store_max_bytes)

    def pools(self) -> list[ModelPool]:
        return list(self._pools.values())

    def pool(self, model: str) -> ModelPool:
        """The pool serving `model`; an OpenAI 404 for a model nobody serves."""
        pool = self._pools.get(model)
        if pool is None:
            raise errors.model_not_found(model)
        return pool

    def healthy(self) -> bool:
        """Ready: not draining, and some model has an engine that can take requests."""
        return not self.draining and any(pool.healthy() for pool in self._pools.values())


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
    #: The model directory's `config.json` (`hidden_size`, Matryoshka dimensions of an embedding model).
    model_config: Mapping[str, Any] = field(default_factory=dict)
    #: `--engine-busy-threshold`: polled and own load per worker, and which workers are busy.
    busy: EngineLoads | None = None
    #: The frontend's watch over open streams and engine calls (keep-alives, hung engines).
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
        return Candidates(aggregated, prefill, decode, key=routing_key, disaggregated=self.disaggregated)

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

    def session_key(self, header: str | None, user: object = None) -> str | None:
        """The session key of a request, from its ``X-Session-ID`` header value and its body's
        ``user`` field (used only with `--router-affinity-from-user`); ``None``: no affinity."""
        return session_key(header, user, from_user=self.config.router_affinity_from_user)

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
            # Not up yet at start-up: never routed to; they join when a probe works.
            "pending": [{"engine": p.id, "url": p.url, "reason": p.reason} for p in self.fleet.pending],
        }
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


def routing_key(worker: Worker) -> RoutingKey:
    return RoutingKey(worker.engine.id, worker.dp_rank)


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


async def run_frontend(config: ServeConfig, *, task_status: trio.TaskStatus[Frontend] = trio.TASK_STATUS_IGNORED) -> None:
    async with open_asyncio_loop(), trio.open_nursery() as nursery:
        urls = config.engine_url + config.prefill_engine_url
        if not urls:
            urls = await start_mock_engines(config.mock_engines, config.mock_speedup, nursery)
        keepalive = client_config(config.engine_keepalive_interval, config.engine_keepalive_timeout)
        channels = ChannelPool(connect_timeout=config.connect_timeout, config=keepalive)
        try:
            fleet = await Fleet.connect(
                urls,
                channels,
                api=config.engine_api,
                wait_timeout=config.engine_wait_timeout,
                join_grace=config.engine_join_grace,
                overrides=FleetOverrides(config.model_path, config.served_model_name, config.kv_cache_block_size),
            )
            check_roles(fleet, config.prefill_engine_url)
            tokenizer = await trio.to_thread.run_sync(ModelTokenizer.from_directory, Path(fleet.model.tokenizer_path))
            template = load_chat_template(Path(config.chat_template)) if config.chat_template else None
            kv = None
            if config.router_mode in LOAD_MODES:
                try:
                    kv = KvRouting([engine.card for engine in fleet.engines], config)
                except ValueError as error:
                    raise FleetError(str(error)) from None
            affinity = SessionAffinity(config.router_session_ttl) if config.router_session_ttl > 0 else None
            routing = RoutingPolicy(config.router_mode, enforce_disagg=config.enforce_disagg, kv=kv, affinity=affinity)
            harmony = is_harmony_model(fleet.model.model_path, fleet.model.served_model_name)
            pool = ModelPool(
                config, fleet, routing, tokenizer, template, select_model_parsers(config, fleet.model), harmony
            )
            pool.model_config = await trio.to_thread.run_sync(read_model_config, Path(fleet.model.tokenizer_path))
            watch = StreamWatch(keepalive=config.sse_keepalive, stall_timeout=config.stream_idle_timeout)
            pool.watch = watch
            nursery.start_soon(watch.run)
            tracing.configure(config.otlp_traces_endpoint)
            await trio.to_thread.run_sync(_warm_up_request_path, pool)
            await _connect_for_generation(fleet.engines)
            threshold = _busy_threshold(config)
            # One GetLoad poll feeds both KV routing and the busy threshold when both want it.
            kv_polls = config.load_poll_interval if threshold is None else 0.0
            # KV routing first: an engine that joins (through health checking) is indexed at once.
            if kv is not None:
                pool.kv_feeds = KvFeeds(kv, fleet, load_poll_interval=kv_polls)
                await nursery.start(pool.kv_feeds.run)
                log.info("%s routing: %s", config.router_mode, pool.kv_feeds.stats())
            if threshold is not None:
                pool.busy = busy = EngineLoads(threshold)
                consumers = [pool.apply_load]
                if kv is not None:
                    consumers.append(lambda engine, loads: kv.apply_load(engine.id, engine.card, loads))
                interval = config.load_poll_interval or 1.0
                nursery.start_soon(poll_loads, fleet, interval, consumers, busy.polled)
                log.info("engines count as busy at %s (GetLoad every %gs)", threshold.describe(), interval)
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
                )
                await nursery.start(pool.health.run)
            elif fleet.pending:
                log.warning(
                    "health checks are off (--health-interval 0): engines not up yet (%s) will never join",
                    ", ".join(f"{p.id} ({p.url})" for p in fleet.pending),
                )
            log.info(
                "serving model %r from %d engine(s): %s%s",
                pool.name,
                len(fleet.engines),
                ", ".join(f"{e.id}={e.card.host}:{e.card.port} ({e.card.api}, {e.card.role})" for e in fleet.engines),
                "; not up yet: " + ", ".join(f"{p.id}={p.url}" for p in fleet.pending) if fleet.pending else "",
            )
            nursery.start_soon(monitor_loop_lag)
            if config.gc_full_collection_growth > 0:
                nursery.start_soon(partial(run_gc_policy, config.gc_full_collection_growth))
            # Everything loaded so far (modules, tokenizer, templates) lives as long as the process:
            # keep it out of the cyclic GC, whose full collections otherwise walk those ~60k
            # objects each time and stall every stream for tens of milliseconds.
            gc.freeze()
            task_status.started(Frontend(config, [pool]))
            await trio.sleep_forever()
        finally:
            channels.close()
            nursery.cancel_scope.cancel()
