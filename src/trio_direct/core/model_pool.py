"""One served model's pool: its engines (fleet), routing and text pipeline, as requests use it.

The pool is built and its tasks run by the frontend (`trio_direct.frontend.model_pools`); the request
core and the surfaces only read and route through it, so it lives with them, below the HTTP layer.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from trio_direct import metrics
from trio_direct.config import ServeConfig
from trio_direct.core.watch import StreamWatch
from trio_direct.engine.errors import EngineError
from trio_direct.engine.types import EngineClient
from trio_direct.fleet.card import EngineCard
from trio_direct.fleet.fleet import Engine, Fleet, FleetError, Worker
from trio_direct.fleet.health import EngineHealth
from trio_direct.kv_sync.feeds import KvFeeds
from trio_direct.parsers.selection import ParserSelection
from trio_direct.routing.block_hash import RoutingKey
from trio_direct.routing.busy import UNLIMITED, EngineLoads
from trio_direct.routing.policy import Candidates, Route, RoutingPolicy
from trio_direct.text.tokenizer import ModelTokenizer

log = logging.getLogger(__name__)


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


def routing_key(worker: Worker) -> RoutingKey:
    return RoutingKey(worker.engine.id, worker.dp_rank)


def worker_name(worker: Worker) -> str:
    """A worker as every frontend names it (engine ids are each frontend's own): address and rank."""
    card = worker.engine.card
    return f"{card.host.lower()}:{card.port}/{worker.dp_rank}"


#: Longest session key kept; longer ones are used by their first characters only.
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
