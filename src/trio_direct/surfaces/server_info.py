"""The routes SGLang's and vLLM's users and tools call besides the OpenAI API.

- ``GET /version``: ``{"version": ...}`` (both servers answer it; clients check it to learn they
  talk to a live server).
- ``GET /get_model_info``: SGLang's: the model's path, tokenizer path, whether it generates, its
  type and architectures, context length and parsers (``?model=NAME`` when several are served),
  plus which encoder tokenizes its prompts (`tokenizer_encoder`).
- ``GET /get_server_info``: SGLang's: the frontend's settings (secrets left out), its version, and
  every engine as ``GET /admin/engines`` lists it.
- ``GET /health_generate``: SGLang's deep health check: one real token generated through the router
  (admission aside); 200 when it came back, 503 otherwise.
- ``POST /flush_cache`` (admin API): `FlushCache` on every engine of the model; 200 when every
  engine flushed, 400 with each engine's answer otherwise (an engine with requests running
  declines, as SGLang's does).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

import msgspec
import trio

from trio_direct import __version__
from trio_direct.core import errors
from trio_direct.core.render import unary_response
from trio_direct.engine.errors import EngineError
from trio_direct.openai.requests import decode_completion_request
from trio_direct.surfaces.completions import CompletionRenderer, plan_completion

if TYPE_CHECKING:
    from trio_direct.core.pool import PoolView
    from trio_direct.http.exchange import Exchange

__all__ = ["flush_cache", "get_model_info", "get_server_info", "health_generate", "version"]

#: Settings never shown by `/get_server_info`.
_SECRETS = frozenset({"api_key", "admin_api_key"})
#: How long `/health_generate`'s one token may take.
HEALTH_GENERATE_TIMEOUT = 20.0
#: How long an engine may wait for its running requests before it declines to flush.
FLUSH_TIMEOUT = 30.0


async def version(exchange: Exchange) -> None:
    await exchange.json(200, msgspec.json.encode({"version": __version__}))


def _query_model(exchange: Exchange) -> str | None:
    values = parse_qs(exchange.scope.get("query_string", b"").decode("latin-1")).get("model")
    return values[0] if values else None


def _body_model(exchange: Exchange) -> str | None:
    if not exchange.body.strip():
        return _query_model(exchange)
    try:
        fields = msgspec.json.decode(exchange.body)
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
        raise errors.invalid_request('The body must be JSON: {"model"?: NAME}.') from None
    if not isinstance(fields, dict):
        raise errors.invalid_request('The body must be a JSON object: {"model"?: NAME}.')
    model = fields.get("model")
    if model is not None and not isinstance(model, str):
        raise errors.invalid_request("'model' must be a string.", param="model")
    return model or _query_model(exchange)


def model_info(pool: PoolView) -> dict[str, Any]:
    model = pool.fleet.model
    config = pool.model_config
    return {
        "model_path": model.model_path,
        "tokenizer_path": model.tokenizer_path,
        "served_model_name": pool.name,
        "is_generation": not pool.is_embedding,
        "max_model_len": pool.context_length,
        "model_type": config.get("model_type"),
        "architectures": config.get("architectures"),
        "has_image_understanding": pool.supports_images,
        "tool_call_parser": pool.tool_call_parser,
        "reasoning_parser": pool.reasoning_parser,
        # Which encoder tokenizes prompts, and why (text.fast_bpe).
        "tokenizer_encoder": pool.tokenizer.encoder_info,
    }


async def get_model_info(exchange: Exchange) -> None:
    pool = exchange.frontend.pool_or_only(_query_model(exchange))
    await exchange.json(200, msgspec.json.encode(model_info(pool)))


async def get_server_info(exchange: Exchange) -> None:
    frontend = exchange.frontend
    settings = {name: value for name, value in dataclasses.asdict(frontend.config).items() if name not in _SECRETS}
    body = {
        "version": __version__,
        "server_args": settings,
        "models": [model_info(pool) for pool in frontend.pools()],
        "engines": frontend.engine_report(),
    }
    await exchange.json(200, msgspec.json.encode(body))


async def health_generate(exchange: Exchange) -> None:
    """One token from an engine the router picks: the whole path a request takes, engines included."""
    frontend = exchange.frontend_or_none
    pools = [pool for pool in frontend.pools() if not pool.is_embedding] if frontend is not None else []
    if frontend is None or frontend.draining or not pools:
        await exchange.json(503, b'{"status":"unavailable"}')
        return
    pool = pools[0]
    request = decode_completion_request(
        msgspec.json.encode({"model": pool.name, "prompt": "Hi", "max_tokens": 1, "temperature": 0})
    )
    with trio.move_on_after(HEALTH_GENERATE_TIMEOUT):
        try:
            plan = await plan_completion(pool, request)
            renderer = CompletionRenderer(plan, pool.token_text, echo=False, logprobs=False)
            await unary_response(pool, plan, renderer, cutter=frontend.cutter)
        except errors.ApiError as error:
            body = {"status": "unavailable", "model": pool.name, "error": error.message}
            await exchange.json(503, msgspec.json.encode(body))
            return
        await exchange.json(200, msgspec.json.encode({"status": "ok", "model": pool.name}))
        return
    await exchange.json(503, msgspec.json.encode({"status": "unavailable", "error": "timed out"}))


async def flush_cache(exchange: Exchange) -> None:
    pool = exchange.frontend.pool_or_only(_body_model(exchange))
    engines = list(pool.fleet.engines)
    results: list[dict[str, Any]] = [{} for _ in engines]

    async def flush(index: int) -> None:
        engine = engines[index]
        entry = results[index]
        entry["engine"] = engine.id
        flush = getattr(engine.client, "flush_cache", None)
        if flush is None:
            entry.update(success=False, message=f"the {engine.client.api} API has no FlushCache")
            return
        try:
            success, message = await flush(timeout=FLUSH_TIMEOUT)
        except EngineError as error:
            success, message = False, str(error)
        entry.update(success=success, message=message)

    async with trio.open_nursery() as nursery:
        for index in range(len(engines)):
            nursery.start_soon(flush, index)
    flushed = bool(engines) and all(entry["success"] for entry in results)
    body = {"success": flushed, "model": pool.name, "engines": results}
    await exchange.json(200 if flushed else 400, msgspec.json.encode(body))
