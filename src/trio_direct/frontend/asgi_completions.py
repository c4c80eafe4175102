"""`POST /v1/chat/completions` and `POST /v1/completions` served straight on ASGI.

These two routes carry every token, so they skip Quart's request and response machinery (about a
millisecond per request and a share of every streamed chunk on this stack) and order the work for
the shortest time to first token: plan, dispatch the engine calls, only then write the response
headers. Every other route stays on Quart (`frontend.app`).

A client that disconnects is noticed by a task reading ASGI messages, which cancels the request's
scope; the engine calls then end through `open_engine_call`'s ``finally`` (an `Abort` each).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import trio

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


def with_completion_routes(app: App, get_frontend: Callable[[], Frontend | None], *, max_body_bytes: int) -> App:
    """Wrap `app` (Quart's ASGI callable) so the completion routes are served here."""

    async def asgi(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in _PLANS:
            await app(scope, receive, send)
        elif scope["method"] == "POST":
            await _serve(_PLANS[scope["path"]], get_frontend, max_body_bytes, receive, send)
        else:
            error = errors.OpenAIError(f"Method Not Allowed: {scope['method']} {scope['path']}", status=405)
            await _Response(send).json(405, error.to_json(), extra_headers=[(b"allow", b"POST")])

    return asgi


async def _serve(plan, get_frontend, max_body_bytes: int, receive: Receive, send: Send) -> None:
    response = _Response(send)
    try:
        async with trio.open_nursery() as nursery:
            body = await _read_body(receive, max_body_bytes)
            if body is None:
                return  # the client left before sending its request: nothing to answer
            nursery.start_soon(_cancel_on_disconnect, receive, nursery.cancel_scope)
            frontend = get_frontend()
            if frontend is None:
                raise errors.service_unavailable("The server is starting: no engine is ready yet.")
            completion = await plan(frontend, body)
            if completion.request.stream:
                await _stream(frontend, completion, response)
            else:
                await response.json(200, await completions.complete_unary(frontend, completion))
            nursery.cancel_scope.cancel()
    except* OpenAIError as group:
        error = group.exceptions[0]
        close = error.status == 413  # the rest of the body was never read
        await response.json(error.status, error.to_json(), close=close)
    except* Exception as group:
        log.error("unexpected error serving a completion", exc_info=group.exceptions[0])
        await response.json(500, errors.internal_error().to_json())


async def _stream(frontend: Frontend, completion: completions.Completion, response: _Response) -> None:
    chunks = completions.stream_completion(frontend, completion)
    try:
        async for chunk in chunks:
            if not response.started:  # the first item comes once the engine calls are dispatched
                await response.start(200, _SSE_HEADERS)
            if chunk:
                await response.body(chunk)
        await response.end()
    finally:
        await chunks.aclose()


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

    __slots__ = ("_send", "started", "ended")

    def __init__(self, send: Send) -> None:
        self._send = send
        self.started = False
        self.ended = False

    async def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.started = True
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
