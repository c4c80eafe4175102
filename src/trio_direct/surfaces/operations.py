"""Operational endpoints: liveness, readiness, Prometheus metrics and the routing debug view."""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec
from prometheus_client import CONTENT_TYPE_LATEST

from trio_direct.core import errors
from trio_direct.metrics import exposition
from trio_direct.openai.requests import decode_chat_request, decode_completion_request
from trio_direct.surfaces.chat import plan_chat
from trio_direct.surfaces.completions import plan_completion

if TYPE_CHECKING:
    from trio_direct.http.exchange import Exchange

__all__ = ["health", "live", "metrics", "routing_for_prompt", "routing_state"]

_OK = b'{"status":"ok"}'


async def live(exchange: Exchange) -> None:
    """The process answers: for a liveness probe (never depends on engines)."""
    await exchange.json(200, _OK)


async def health(exchange: Exchange) -> None:
    """Ready to serve: some engine can take requests, and the server is not draining."""
    frontend = exchange.frontend_or_none
    if frontend is None or not frontend.healthy():
        await exchange.json(503, b'{"status":"unavailable"}')
        return
    await exchange.json(200, _OK)


async def metrics(exchange: Exchange) -> None:
    body = exposition()
    await exchange.start(200, [(b"content-type", CONTENT_TYPE_LATEST.encode()), (b"content-length", b"%d" % len(body))])
    await exchange.end(body)


async def routing_state(exchange: Exchange) -> None:
    """`GET /debug/routing`: the mode, the workers, and in kv mode the index state, per model."""
    pools = exchange.frontend.pools()
    if len(pools) == 1:
        report = pools[0].explain_route()
    else:
        report = {"models": {pool.name: pool.explain_route() for pool in pools}}
    await exchange.json(200, msgspec.json.encode(report))


async def routing_for_prompt(exchange: Exchange) -> None:
    """`POST /debug/routing` with a chat or completions body: how it would be routed now (nothing is
    recorded or sent)."""
    body = exchange.body
    frontend = exchange.frontend
    if b'"messages"' in body:
        chat = decode_chat_request(body)
        pool = frontend.pool(chat.model)
        plan = await plan_chat(pool, chat)
    else:
        completion = decode_completion_request(body)
        pool = frontend.pool(completion.model)
        plan = await plan_completion(pool, completion)
    if not plan.prompts:
        raise errors.invalid_request("Nothing to route.")
    report = pool.explain_route(plan.prompts[0].token_ids)
    await exchange.json(200, msgspec.json.encode(report))
