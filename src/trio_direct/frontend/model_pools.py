"""Opening one model's pool and running its tasks: tokenizer, template, parsers, routing, KV feeds, health.

`open_model_pool` builds a `ModelPool` for a fleet (the tokenizer loaded in a worker thread, routing
from the registry of policies); `run_model_pool` runs its KV feeds, load polls and health checks in a
nursery of its own until its last engine left or the frontend stops.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import trio

from trio_direct.config import ServeConfig, routing_settings
from trio_direct.core.model_pool import ModelPool
from trio_direct.core.watch import StreamWatch
from trio_direct.engine.errors import EngineError
from trio_direct.engine.transport import ChannelPool
from trio_direct.fleet.fleet import Engine, Fleet, FleetError, FleetModel
from trio_direct.fleet.health import EngineHealth
from trio_direct.fleet.tokenizer_source import TokenizerNotFound, locate_tokenizer
from trio_direct.kv_sync.feeds import KvFeeds
from trio_direct.kv_sync.load_poll import poll_loads
from trio_direct.openai.requests import warm_up_request_decoding
from trio_direct.parsers.selection import ParserSelection, select_parsers
from trio_direct.routing.affinity import SessionAffinity
from trio_direct.routing.busy import BusyThreshold, EngineLoads
from trio_direct.routing.load_aware import LoadAwareRouting
from trio_direct.routing.policies import routing_policy
from trio_direct.routing.policy import RoutingPolicy
from trio_direct.text.chat_template import ChatTemplateError, render_chat
from trio_direct.text.harmony import harmony_encoding, is_harmony_model
from trio_direct.text.tokenizer import TokenizerLoadError

log = logging.getLogger(__name__)


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


async def connect_for_generation(engines: Sequence[Engine]) -> None:
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
            kv = LoadAwareRouting([engine.card for engine in fleet.engines], settings)
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
