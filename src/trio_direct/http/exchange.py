"""One HTTP request and its response, as a route handler sees them.

The HTTP layer (`http.app`) has already matched the route, checked the API key, counted the
request against admission, read its body within the size limit and started the disconnect watch;
the handler reads `body` and `params`, and answers with `json`, or with `respond` for a planned
generation (streamed or unary, by the plan), which runs the request pipeline
(`core.pipeline.serve_planned`: admit, dispatch, render, write) with this exchange as its writer. Errors are raised as `ApiError`: the
HTTP layer writes them in the route's own envelope.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

import msgspec
import trio

from trio_direct.core import errors
from trio_direct.core.admission import Admission, Ticket
from trio_direct.core.pipeline import admit_turn, serve_planned
from trio_direct.core.plan import RequestPlan
from trio_direct.core.render import Renderer
from trio_direct.core.request_context import session_key
from trio_direct.http.connection import DirectBody, direct_body_writer, send_direct_response, start_direct_response
from trio_direct.tenants.limiter import Grant

if TYPE_CHECKING:
    from trio_direct.core.frontend import Frontend
    from trio_direct.core.pool import PoolView

__all__ = ["Exchange", "Receive", "Scope", "Send", "request_priority"]

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

log = logging.getLogger(__name__)

_JSON = (b"content-type", b"application/json")

#: Bound on the shielded last write of a response (a socket write and hypercorn's bookkeeping).
LAST_SEND_TIMEOUT = 10.0

_INT32 = 2**31


class _Priority(msgspec.Struct):
    priority: int | None = None


_decode_priority = msgspec.json.Decoder(_Priority).decode


def request_priority(body: bytes) -> int | None:
    """A generation request's ``priority`` (SGLang's extension field; higher is served first).

    Read here, for every surface alike, from a body its surface has already decoded and validated;
    a body without the word costs a substring search, not a second parse.
    """
    if b'"priority"' not in body:
        return None
    try:
        priority = _decode_priority(body).priority
    except msgspec.ValidationError:
        raise errors.invalid_request("'priority' must be an integer.", param="priority") from None
    except msgspec.DecodeError:
        return None  # not JSON at all: the surface's own decoder said so already
    if priority is not None and not -_INT32 <= priority < _INT32:
        raise errors.invalid_request("'priority' must fit in 32 bits.", param="priority")
    return priority


class Exchange:
    """The request a handler serves and the response it writes (the `core.render.ResponseWriter`)."""

    __slots__ = (
        "scope", "_send", "body", "params", "started", "_frontend", "status", "headers_sent", "ended",
        "extra_headers", "model", "stream", "admission", "ticket", "grant", "plan", "counted", "_write_body",
        "_direct",
    )  # fmt: skip

    def __init__(
        self,
        scope: Scope,
        send: Send,
        *,
        frontend: Frontend | None,
        params: dict[str, str],
        extra_headers: list[tuple[bytes, bytes]],
    ) -> None:
        self.scope = scope
        self._send = send
        self.body = b""
        self.params = params
        #: Arrival, for time to first token.
        self.started = time.perf_counter()
        self._frontend = frontend
        self.status = 0
        self.headers_sent = False
        self.ended = False
        #: How `send` writes body bytes, chosen at the first: straight to the connection where it
        #: offers that (`http.connection.direct_body_writer`), else as ASGI messages.
        self._write_body: Callable[[bytes], Awaitable[None]] | None = None
        self._direct: DirectBody | None = None
        #: Headers every response of this request carries (CORS).
        self.extra_headers = extra_headers
        #: Metrics labels, known once the body is read.
        self.model = ""
        self.stream = False
        #: A generation request's place in admission (set by the HTTP layer for counted routes).
        self.admission: Admission | None = None
        self.ticket: Ticket | None = None
        #: Its account with its tenant's limits (`tenants.limiter`), and the plan whose tokens it is charged.
        self.grant: Grant | None = None
        self.plan: RequestPlan | None = None
        #: (prompt, completion) tokens of a request answered without a plan (`count_usage`).
        self.counted: tuple[int, int] | None = None

    @property
    def frontend(self) -> Frontend:
        """The running frontend (routes that need one are answered 503 while it starts)."""
        assert self._frontend is not None
        return self._frontend

    @property
    def frontend_or_none(self) -> Frontend | None:
        """The frontend, or None while it starts (for routes that answer then too)."""
        return self._frontend

    def header(self, name: bytes) -> bytes | None:
        """The first value of request header `name` (lower case), if sent."""
        for key, value in self.scope["headers"]:
            if key == name:
                return value
        return None

    def label(self, model: str, stream: bool) -> None:
        """What the request metrics say of this request."""
        self.model = model
        self.stream = stream

    def session_key(self, user: str | None = None) -> str | None:
        """The routing affinity key: the `X-Session-ID` header, else the request's `user` when
        ``--router-affinity-from-user`` is on (`core.request_context.session_key`)."""
        value = self.header(b"x-session-id")
        header = value.decode("latin-1") if value is not None else None
        return session_key(header, user, from_user=self.frontend.config.router_affinity_from_user)

    # ---- the response --------------------------------------------------------------------------------

    async def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.headers_sent = True
        self.status = status
        headers = headers + self.extra_headers
        # Under `serve`, the common streamed response's head goes straight to the connection, and its
        # body and end after it (`http.connection.start_direct_response`); any other through ASGI.
        direct = await start_direct_response(self.scope, status, headers)
        if direct is not None:
            self._direct = direct
            self._write_body = direct.write
            return
        await self._send({"type": "http.response.start", "status": status, "headers": headers})

    async def send(self, data: bytes) -> None:
        write = self._write_body
        if write is None:
            write = self._choose_body_writer()
        await write(data)
        grant = self.grant
        if grant is not None and grant.tracked and grant.charge_due(time.monotonic()):
            # A stream's tokens count against its tenant as they go, and its slot's lease is renewed,
            # whichever writer carries the body (the direct one under `serve`, ASGI under hypercorn).
            await self._charge(grant)

    async def send_last(self, data: bytes) -> None:
        """A streamed body's last bytes and its end (`send` then `end`), in one write to the
        connection where the body goes straight there."""
        if self._write_body is None:
            self._choose_body_writer()
        direct = self._direct
        if direct is None:
            await self.send(data)
            await self.end()
            return
        if direct.can_finish():
            await self.end(data)
            return
        await direct.write_last(data, self.end)

    def _choose_body_writer(self) -> Callable[[bytes], Awaitable[None]]:
        direct = self._direct = direct_body_writer()
        write = self._write_body = direct.write if direct is not None else self._send_body
        return write

    async def _send_body(self, data: bytes) -> None:
        await self._send({"type": "http.response.body", "body": data, "more_body": True})

    async def _charge(self, grant: Grant) -> None:
        usage = self.usage()
        if usage is None:
            return
        try:
            await grant.charge(usage[0] + usage[1])
        except Exception as failure:  # noqa: BLE001 - a shared store out of reach never cuts a stream
            log.warning("cannot count tokens against the tenant's limit: %s", failure)

    def count_usage(self, prompt_tokens: int, completion_tokens: int = 0) -> None:
        """The tokens of a request that is not answered through `respond` (embeddings), for its
        tenant's limits and metrics."""
        self.counted = (prompt_tokens, completion_tokens)

    def usage(self) -> tuple[int, int] | None:
        """(prompt, completion) tokens of the planned generation so far; None before it is planned."""
        plan = self.plan
        if plan is None:
            return self.counted
        usage = plan.usage()
        return usage.prompt_tokens, usage.completion_tokens

    async def end(self, data: bytes = b"") -> None:
        self.ended = True
        direct = self._direct
        if direct is not None and direct.can_finish():  # straight to the connection, as the body went
            await _shielded_last(direct.finish, data)
            return
        await _shielded_last(self._send, {"type": "http.response.body", "body": data, "more_body": False})

    async def json(
        self, status: int, payload: bytes, *, headers: Sequence[tuple[bytes, bytes]] = (), close: bool = False
    ) -> None:
        """A whole JSON response. After a stream's headers went out, only ends the stream."""
        if self.ended:
            return
        if self.headers_sent:
            await self.end()
            return
        head = [_JSON, (b"content-length", b"%d" % len(payload)), *headers]
        if close:
            head.append((b"connection", b"close"))
        # Under `serve`, head and body in one write straight to the connection, as a stream's are;
        # shielded (bounded) as any response's end is (`_shielded_last`).
        direct: bool | None = None
        with trio.CancelScope(shield=True) as scope:
            scope.deadline = trio.current_time() + LAST_SEND_TIMEOUT
            direct = await send_direct_response(self.scope, status, head + self.extra_headers, payload)
        if direct is not False:  # written, or its write ran out of time: either way the response is over
            self.headers_sent = self.ended = True
            self.status = status
            return
        await self.start(status, head)
        await self.end(payload)

    async def respond(
        self,
        pool: PoolView,
        plan: RequestPlan,
        renderer: Renderer,
        *,
        settle: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """Serve a planned generation once admitted: SSE events as they come, or one body at the end
        (`core.pipeline.serve_planned`, with this exchange as the writer). `settle` runs once the
        output is complete, before its end is written (`stream_response`)."""
        self.plan = plan
        grant = self.grant
        await serve_planned(
            pool,
            plan,
            renderer,
            self,
            priority=request_priority(self.body),
            admit=lambda priority, trace: self.admit(pool, priority, trace),
            cutter=self.frontend.cutter,
            charge=(lambda: self._charge(grant)) if grant is not None and grant.metered else None,
            settle=settle,
        )

    async def admit(self, pool: PoolView, priority: int | None = None, trace: Any = None) -> None:
        """Wait for this request's turn (`core.pipeline.admit_turn`): a slot, and an engine of `pool`
        below the busy threshold. `respond` does it; a generation handler that does not answer
        through `respond` must call it before it sends anything to an engine. Raises `ApiError`
        429/503."""
        await admit_turn(self.admission, self.ticket, pool, priority, trace)

    def query(self, name: str) -> str | None:
        """The first value of query parameter `name`, if given."""
        values = parse_qs(self.scope.get("query_string", b"").decode("latin-1")).get(name)
        return values[0] if values else None


async def _shielded_last(send: Callable[[Any], Awaitable[None]], message: Any) -> None:
    """The last message of a response (an ASGI message, or the last bytes for `DirectBody.finish`),
    shielded from cancellation (bounded).

    Completing a response makes hypercorn report the client gone, and the request's reaction
    (cancel its scope) lands while hypercorn is still inside that last `send`, recycling the
    connection for keep-alive. Cancelled there, hypercorn never starts the connection's idle timer:
    the idle keep-alive connection then never times out, and holds a graceful shutdown for its
    whole timeout.
    """
    with trio.CancelScope(shield=True) as scope:
        scope.deadline = trio.current_time() + LAST_SEND_TIMEOUT
        await send(message)
