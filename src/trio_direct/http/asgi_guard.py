"""An ASGI wrapper that answers, before the app sees them, the requests no route may serve.

- A declared ``Content-Length`` above ``--max-body-bytes``: 413 at once, before any of the body is
  read (otherwise the client uploads all of it only to be refused).
- ``Content-Length`` together with ``Transfer-Encoding``: 400 once the body is read (as chunks, up to
  the limit), and the connection closes. h11 frames such a body by its chunks and ignores the
  length; a proxy in front may have done the opposite, so what follows the body on this connection
  may be a request smuggled past the proxy. RFC 9112 §6.1: close the connection after responding.
- A WebSocket handshake: 400. The app speaks HTTP only; unguarded, Quart answers 500 and logs a
  traceback for each attempt, so anyone could fill the log.

Each answer is in the envelope of the route asked for (OpenAI's, or Anthropic's on the Messages
routes: `error_body_for`); over HTTP/1.x it carries ``Connection: close``, which makes hypercorn
close the connection once the answer is written, whatever the client sent after it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from trio_direct.core import errors
from trio_direct.core.errors import ApiError
from trio_direct.openai.errors import openai_error_body

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
#: Any ASGI 3 app (Quart's own type annotations are narrower than these dicts).
ASGIApp = Callable[[Any, Any, Any], Awaitable[None]]
#: The error body writer for a request (its route's envelope).
ErrorBodyFor = Callable[[Scope], Callable[[ApiError], bytes]]

CONFLICTING_FRAMING = "conflicting_framing"


def refusal(headers: Iterable[tuple[bytes, bytes]], max_body_bytes: int) -> ApiError | None:
    """Why a request with these headers must be answered without reading its body, or None."""
    lengths: list[bytes] = []
    chunked = False
    for name, value in headers:
        name = name.lower()
        if name == b"content-length":
            lengths.append(value)
        elif name == b"transfer-encoding":
            chunked = True
    if lengths and chunked:
        return errors.invalid_request(
            "The request has both Content-Length and Transfer-Encoding headers: send only one.",
            code=CONFLICTING_FRAMING,
        )
    if not lengths:
        return None
    try:
        length = int(lengths[0].split(b",")[0].strip())
    except ValueError:
        return errors.invalid_request("The Content-Length header is not a number.", code="invalid_framing")
    if length > max_body_bytes:
        return errors.payload_too_large(max_body_bytes)
    return None


def websocket_refusal() -> ApiError:
    return errors.invalid_request("This server does not accept WebSocket connections.", code="websocket_not_supported")


class ProtocolGuard:
    """Wraps the app: answers what `refusal` names and WebSocket handshakes; passes the rest on."""

    def __init__(self, app: ASGIApp, *, max_body_bytes: int, error_body_for: ErrorBodyFor | None = None) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.error_body_for = error_body_for

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            error = refusal(scope["headers"], self.max_body_bytes)
            if error is None:
                await self.app(scope, receive, send)
                return
            if error.code == CONFLICTING_FRAMING:
                # Read the (chunk-framed) body first, up to the limit: answering while it still arrives
                # races hypercorn's own close on the bytes behind it, which can cut the answer short.
                await _discard_body(receive, self.max_body_bytes)
            body = self.error_body_for(scope)(error) if self.error_body_for is not None else openai_error_body(error)
            await _answer_http(scope, send, error, body)
        elif kind == "websocket":
            await _refuse_websocket(scope, receive, send)
        else:  # lifespan: the app's start-up and shutdown
            await self.app(scope, receive, send)


async def _discard_body(receive: Receive, limit: int) -> None:
    received = 0
    while received <= limit:
        message = await receive()
        if message["type"] != "http.request":
            return  # the client left
        received += len(message.get("body", b""))
        if not message.get("more_body"):
            return


async def _answer_http(scope: Scope, send: Send, error: ApiError, body: bytes) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if str(scope.get("http_version", "1.1")).startswith("1"):
        headers.append((b"connection", b"close"))  # HTTP/2 forbids the header and has no such framing
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _refuse_websocket(scope: Scope, receive: Receive, send: Send) -> None:
    if (await receive())["type"] != "websocket.connect":
        return  # the client left before its handshake was handed over
    error = websocket_refusal()
    if "websocket.http.response" not in scope.get("extensions", {}):
        await send({"type": "websocket.close", "code": 1008})  # the server answers the handshake 403
        return
    body = openai_error_body(error)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "websocket.http.response.start", "status": error.status, "headers": headers})
    await send({"type": "websocket.http.response.body", "body": body})
