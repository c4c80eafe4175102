"""`POST /v1/chat/completions` and `POST /v1/completions` served straight on ASGI.

These two routes carry every token, so they skip Quart's request and response machinery (about a
millisecond per request and a share of every streamed chunk on this stack) and order the work for
the shortest time to first token: plan, dispatch the engine calls, only then write the response
headers. Every other route stays on Quart (`frontend.app`).

A client that disconnects is noticed by a task reading ASGI messages, which cancels the request's
scope; the engine calls then end through `open_engine_call`'s ``finally`` (an `Abort` each).
"""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from trio_direct import metrics
from trio_direct.frontend import completions
from trio_direct.frontend.runtime import Frontend
from trio_direct.openai import errors
from trio_direct.openai.errors import OpenAIError

log = logging.getLogger(__name__)

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

_JSON_HEADERS = [(b"content-type", b"application/json")]
_SSE_HEADERS = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]
_PLANS = {
    "/v1/chat/completions": completions.plan_chat,
    "/v1/completions": completions.plan_completion,
}


#: Open without an API key: probes and scrapers must work whatever the clients' credentials.
_OPEN_PATHS = frozenset({"/health", "/live", "/metrics"})


def with_completion_routes(
    app: App,
    get_frontend: Callable[[], Frontend | None],
    *,
    max_body_bytes: int,
    api_key: str | None = None,
    max_concurrent: int = 0,
) -> App:
    """Wrap `app` (Quart's ASGI callable): the completion routes are served here, and every route
    but the open ones needs `api_key` as a Bearer token when one is set."""
    expected = f"Bearer {api_key}".encode() if api_key else None
    limit = _Limit(max_concurrent)

    async def asgi(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        send = _finish_shielded(send)
        path = scope["path"]
        if expected is not None and path not in _OPEN_PATHS and not _authorized(scope, expected):
            error = errors.unauthorized()
            await _Response(send).json(error.status, error.to_json(), extra_headers=[(b"www-authenticate", b"Bearer")])
        elif path not in _PLANS:
            await app(scope, receive, send)
        elif scope["method"] != "POST":
            error = errors.OpenAIError(f"Method Not Allowed: {scope['method']} {path}", status=405)
            await _Response(send).json(405, error.to_json(), extra_headers=[(b"allow", b"POST")])
        elif not limit.enter():
            error = errors.rate_limited(f"The server is at its limit of {max_concurrent} concurrent requests; retry later.")
            await _Response(send).json(error.status, error.to_json(), extra_headers=[(b"retry-after", b"1")])
        else:
            try:
                await _serve(path, get_frontend, max_body_bytes, receive, send)
            finally:
                limit.leave()

    return asgi


#: Bound on the shielded last write of a response (a socket write and hypercorn's bookkeeping).
_LAST_SEND_TIMEOUT = 10.0


def _finish_shielded(send: Send) -> Send:
    """`send`, with a response's last message shielded from cancellation.

    Completing a response makes hypercorn report the client gone, and the handler's reaction
    (quart-trio's, and ours: cancel the request's scope) lands while hypercorn is still inside
    that last `send`, recycling the connection for keep-alive. Cancelled there, hypercorn never
    starts the connection's idle timer: the idle keep-alive connection then never times out, and
    holds a graceful shutdown for its whole timeout.
    """

    async def finish_shielded(message: dict) -> None:
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            with trio.CancelScope(shield=True) as scope:
                scope.deadline = trio.current_time() + _LAST_SEND_TIMEOUT
                await send(message)
        else:
            await send(message)

    return finish_shielded


def _authorized(scope: Scope, expected: bytes) -> bool:
    for name, value in scope["headers"]:
        if name == b"authorization":
            return hmac.compare_digest(value, expected)
    return False


class _Limit:
    """`--max-concurrent-requests` (0: no limit)."""

    __slots__ = ("limit", "active")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.active = 0

    def enter(self) -> bool:
        if self.limit and self.active >= self.limit:
            return False
        self.active += 1
        return True

    def leave(self) -> None:
        self.active -= 1


async def _serve(path: str, get_frontend, max_body_bytes: int, receive: Receive, send: Send) -> None:
    response = _Response(send)
    endpoint = "chat" if path == "/v1/chat/completions" else "completions"
    labels = {"model": "", "endpoint": endpoint, "stream": "false"}
    started = time.perf_counter()
    metrics.IN_FLIGHT.inc()
    try:
        async with trio.open_nursery() as nursery:
            body = await _read_body(receive, max_body_bytes)
            if body is None:
                response.status = 499  # the client left before sending its request
                return
            nursery.start_soon(_cancel_on_disconnect, receive, nursery.cancel_scope)
            frontend = get_frontend()
            if frontend is None:
                raise errors.service_unavailable("The server is starting: no engine is ready yet.")
            labels["model"] = frontend.model_name
            completion = await _PLANS[path](frontend, body)
            labels["stream"] = "true" if completion.request.stream else "false"
            # Metrics are recorded before the last write: once the response is complete the server
            # reports the client gone, which cancels this scope.
            if completion.request.stream:
                await _stream(frontend, completion, response, started)
            else:
                payload = await completions.complete_unary(frontend, completion)
                metrics.TTFT.labels(labels["model"]).observe(time.perf_counter() - started)
                _count_tokens(labels["model"], completion)
                await response.json(200, payload)
            nursery.cancel_scope.cancel()
    except* OpenAIError as group:
        await _answer_error(response, group.exceptions[0])
    except* Exception as group:
        log.error("unexpected error serving a completion", exc_info=group.exceptions[0])
        await response.json(500, errors.internal_error().to_json())
    finally:
        metrics.IN_FLIGHT.dec()
        status = response.status if response.ended else 499  # 499: the client went away
        metrics.REQUESTS.labels(status=str(status), **labels).inc()
        metrics.DURATION.labels(labels["model"], endpoint).observe(time.perf_counter() - started)


async def _answer_error(response: _Response, error: OpenAIError) -> None:
    # Not a local of `_serve`: the error's traceback holds that frame, so a local there would keep
    # request, response and error alive in a reference cycle until a full garbage collection.
    close = error.status == 413  # the rest of the body was never read
    await response.json(error.status, error.to_json(), close=close)


def _count_tokens(model: str, completion: completions.Completion) -> None:
    if not completion.plans or completion.plans[0].client is None:
        return
    usage = completion.usage()
    metrics.TOKENS.labels(model, "input").inc(usage.prompt_tokens)
    metrics.TOKENS.labels(model, "output").inc(usage.completion_tokens)
    metrics.TOKENS.labels(model, "cached").inc(usage.cached_tokens)


async def _stream(frontend: Frontend, completion: completions.Completion, response: _Response, started: float) -> None:
    ttft = gaps = None  # looked up once the engine calls are dispatched
    last = None

    async def write(chunk: bytes) -> None:
        # Timed as the chunk is handed to the server, recorded once it is out: the histograms'
        # bookkeeping never delays a token.
        nonlocal last
        now = time.perf_counter()
        await response.body(chunk)
        if last is None:
            ttft.observe(now - started)
        else:
            gaps.observe(now - last)
        last = now

    # This task enters the request's nursery itself (`open_stream`): a disconnect that cancels a
    # write here tears the engine calls down through plain `async with` exits.
    async with completions.open_stream(frontend, completion) as stream:
        # The engine calls are dispatched: what follows is done while the engine works.
        ttft = metrics.TTFT.labels(frontend.model_name)
        gaps = metrics.INTER_TOKEN.labels(frontend.model_name)
        await response.start(200, _SSE_HEADERS)
        async for chunk in stream:
            await write(chunk)
    for chunk in stream.ending():
        await write(chunk)
    _count_tokens(frontend.model_name, completion)
    await response.end()


async def _read_body(receive: Receive, limit: int) -> bytes | None:
    body = bytearray()
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        body += message.get("body", b"")
        if len(body) > limit:
            raise errors.payload_too_large(limit)
        if not message.get("more_body"):
            return bytes(body)


async def _cancel_on_disconnect(receive: Receive, scope: trio.CancelScope) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    scope.cancel()


class _Response:
    """The ASGI send side of one response."""

    __slots__ = ("_send", "started", "ended", "status")

    def __init__(self, send: Send) -> None:
        self._send = send
        self.started = False
        self.ended = False
        self.status = 0

    async def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.started = True
        self.status = status
        await self._send({"type": "http.response.start", "status": status, "headers": headers})

    async def body(self, data: bytes) -> None:
        await self._send({"type": "http.response.body", "body": data, "more_body": True})

    async def end(self) -> None:
        self.ended = True
        await self._send({"type": "http.response.body", "body": b"", "more_body": False})

    async def json(
        self, status: int, payload: bytes, *, close: bool = False, extra_headers: list[tuple[bytes, bytes]] = ()
    ) -> None:
        if self.ended:
            return
        if self.started:  # headers are out: the stream itself reported the failure; just close
            await self.end()
            return
        headers = [*_JSON_HEADERS, *extra_headers]
        if close:
            headers.append((b"connection", b"close"))
        await self.start(status, headers)
        self.ended = True
        await self._send({"type": "http.response.body", "body": payload, "more_body": False})
