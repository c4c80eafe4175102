"""One client connection: hypercorn 0.18's `TCPServer` with read deadlines, HTTP/1.1 only.

hypercorn reads a connection with no deadline of its own while a request head or body arrives: its
`keep_alive_timeout` runs only until a head is complete, and its `read_timeout` would also close a
long streamed response whose client is quietly reading. So `GuardedConnection` replaces the read
loop with one that picks each read's deadline from the request's phase (`limits.ReadDeadlines`)
and answers a stalled request 408. More changes, each against a hypercorn 0.18 behaviour that
`tests/http/test_hypercorn_pins.py` pins so that an upgrade that changes it fails loudly:

- When the client closes a kept-alive connection, hypercorn keeps its socket (in CLOSE-WAIT) and
  the task until its keep-alive timer expires, since the timer runs in the connection's task group.
  Here the timer stops as soon as the read loop ends.
- hypercorn's keep-alive timer is a task started anew at the end of every response and cancelled
  at the next request (a spawn, a lock and several task switches per request, ~1/8 of the CPU of
  a short streamed chat). Here one task per connection watches the keep-alive deadline and the
  server's shutdown, and a request only moves that deadline (`_watch_idle`).
- hypercorn hands a request's body and disconnect to the app through a memory channel whose send
  and receive each yield to the scheduler even when nothing waits; here they yield only when they
  must wait (`AppTaskGroup`), still bounded by the same queue size. A disconnect never waits for
  room in the queue (`_AppQueue`): hypercorn's could wait forever, holding the connection. A
  disconnect cancels the request's work directly (`cancel_on_disconnect`), with no task per
  request waiting for it.
- When hypercorn closes a connection whose next request is already buffered (a pipelining client
  at shutdown), its read loop waits for that request's turn, which never comes, and holds the
  drain for the whole graceful timeout. Here closing the connection also ends the read loop.
- When the client resets the connection while its answer's last bytes are still being written,
  the read loop ends first and the answer's end then restarts the keep-alive timer (both sides
  look done to h11), which held the connection for the whole keep-alive timeout. Here nothing is
  kept alive once the read loop has ended.
- hypercorn writes each response chunk shielded and without a deadline, so a client that stops
  reading holds its request (and its engine's generation) forever. Here a write that makes no
  progress for `ConnectionLimits.client_write_timeout` closes the connection: the app sees the
  client gone and its engine request is aborted, whichever engine transport serves it.
- h11 accepts any byte in a chunk extension and hypercorn upper-cases any method; a control byte
  in a chunk header and a method that is not upper-case (methods are case-sensitive, RFC 9110
  §9.1: ``get`` is not ``GET``) are answered 400 here.
- A streamed (chunked) response body is written by the project itself (`direct_body_writer`):
  one chunk frame straight to the connection per write, instead of an ASGI message through
  hypercorn's stream and protocol layers and an h11 event for each SSE event. The common streamed
  response (a 2xx with a body of unknown length to an HTTP/1.1 client on a kept-alive connection)
  also has its head and its end written here (`start_direct_response`, `DirectBody.finish`):
  the same bytes h11 would write, with h11's and hypercorn's states moved as their own sends
  move them, so keep-alive, recycling and the access log work as before; ~1/6 of the event
  loop's CPU for a short streamed chat went to those two messages' layers. Any other response
  goes through ASGI. The body's last chunk travels in one send with the end either way.
- A write the socket takes at once is made there and then (`_write`): no task switch, no timer.
- hypercorn closes at once, so an answer sent before the request was read (413 up front, 400 to a
  malformed request) meets a connection reset and is lost; here the connection lingers half-closed
  (`GuardedConnection._close`). Bytes after a connection's last request no longer cut its answer
  short (`LastRequestConnection`).
- When an app answers before reading the request's body, hypercorn closes the connection after an
  answer that did not say so, or stops handling the connection's events at the body's next piece
  and never readies it for the next request; here the rest of the body is read past and the
  connection recycled, or the answer says ``Connection: close`` when the body is long
  (`HTTP11Protocol`).

No TLS is configured, so HTTP/2 could only arrive as an ``Upgrade: h2c`` or a prior-knowledge
preface; this server speaks HTTP/1.1 alone (the deadlines above are HTTP/1.1's), so the h2c upgrade
is ignored, as RFC 9110 §7.8 allows, and the preface is answered 505.
"""

from __future__ import annotations

import math
import os
import re
import time
from collections.abc import Awaitable, Callable
from contextlib import suppress
from contextvars import ContextVar
from socket import SHUT_WR
from typing import Any, cast

import h11
import h11._headers
import h11._writers
import trio
from h11._connection import _body_framing
from hypercorn.config import Config
from hypercorn.events import Closed, Event, RawData, Updated
from hypercorn.protocol import ProtocolWrapper
from hypercorn.protocol.events import Body, EndBody, Response, StreamClosed
from hypercorn.protocol.events import Event as StreamEvent
from hypercorn.protocol.h11 import H2ProtocolAssumedError, H11Protocol
from hypercorn.protocol.http_stream import ASGIHTTPState, HTTPStream
from hypercorn.trio.task_group import TaskGroup, _handle
from hypercorn.trio.tcp_server import MAX_RECV, TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import AppWrapper, ConnectionState
from hypercorn.utils import parse_socket_addr

from trio_direct.http import responses
from trio_direct.http.limits import ConnectionLimits, ReadDeadlines, ReadPhase
from trio_direct.metrics import HTTP_TIMEOUTS, HTTP_WRITE_TIMEOUTS

#: A 408 goes to a client that may not be reading: give up writing it after this long.
_SEND_TIMEOUT = 1.0
#: Our h11 states in which no byte of a response was written yet.
_NOTHING_SENT = (h11.IDLE, h11.SEND_RESPONSE)
#: How long a connection hypercorn closes stays half-open for its answer to reach the client.
LINGER_TIME = 5.0
#: A response is written in slices of this size, each given the full write timeout: a large answer
#: to a slow client that does read is never cut, only one that makes no progress at all.
_WRITE_SLICE = 64 * 1024
#: h11's own spelling of the header it adds to a streamed response (`set_comma_header` title-cases it).
_CHUNKED = (b"Transfer-Encoding", b"transfer-encoding", b"chunked")
#: h11's patterns for a header's name and value (the checks its `Response` runs on every header).
_FIELD_NAME = h11._headers._field_name_re
_FIELD_VALUE = h11._headers._field_value_re
#: Headers that take a response off the direct head's path: framing and connection handling are
#: then h11's to decide (and a Host header, which h11 would write first, has no place in one).
_DIRECT_HEAD_EXCLUDED = frozenset((b"content-length", b"transfer-encoding", b"connection", b"host"))
#: Bytes that may not appear in a chunk header (its size and extensions: tokens and quoted strings).
_CHUNK_HEADER_CONTROL = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")


class _CheckedChunkHeaders:
    """h11's receive buffer as its chunked reader sees it, refusing control bytes in chunk headers."""

    __slots__ = ("_buffer",)

    def __init__(self, buffer: Any) -> None:
        self._buffer = buffer

    def maybe_extract_next_line(self) -> Any:
        line = self._buffer.maybe_extract_next_line()
        if line is not None and _CHUNK_HEADER_CONTROL.search(bytes(line).removesuffix(b"\r\n")):
            raise h11.LocalProtocolError("control byte in a chunk header", error_status_hint=400)
        return line

    def __getattr__(self, name: str) -> Any:
        return getattr(self._buffer, name)


class _StrictChunkedReader(h11._readers.ChunkedReader):
    """h11's chunked body reader, which discards chunk extensions unchecked (a NUL included)."""

    def __call__(self, buf: Any) -> Any:
        return super().__call__(_CheckedChunkHeaders(buf))  # type: ignore[arg-type]


class MethodNotUpperCase(Exception):
    """A request method that is not upper-case: answered 400 instead of being upper-cased."""


#: The connection whose task (or a task it started: hypercorn runs each request's app from it) this is.
def _drop_tracebacks(error: BaseException) -> None:
    """Clear the tracebacks along an exception's cause and context chain (the frames they hold
    keep their locals, and with them the exception, alive in a reference cycle)."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        current.__traceback__ = None
        current = current.__cause__ or current.__context__


_current_connection: ContextVar[GuardedConnection | None] = ContextVar("trio_direct_connection", default=None)


class DirectBody:
    """The current response's body, written straight to its connection as chunk frames.

    Each `write` is one chunk frame, sent under the connection's send lock as hypercorn's own writes
    are, at the cost of formatting the frame (~1 µs) instead of an ASGI message through hypercorn's
    layers and an h11 event. The response's end is written here too where the response is still
    the connection's current one (`finish`); otherwise it goes through ASGI (`write_last`), where
    h11 writes the terminating chunk.
    """

    __slots__ = ("_connection",)

    def __init__(self, connection: GuardedConnection) -> None:
        self._connection = connection

    async def write(self, data: bytes) -> None:
        if data:  # an empty chunk would end the body
            await self._connection._write(b"%x\r\n%b\r\n" % (len(data), data))

    def can_finish(self) -> bool:
        """Whether `finish` can end the response here: its stream is still the connection's current
        one, its head went out and its end did not, and its body is chunked (not an HTTP/1.0
        client's, delimited by the connection's close). False once the client is gone."""
        protocol = self._connection._http11
        if protocol is None:
            return False
        stream = protocol.stream
        connection = protocol.connection
        return (
            type(stream) is HTTPStream
            and not stream.closed
            and stream.state is ASGIHTTPState.RESPONSE
            and not stream.response.get("trailers", False)
            and type(connection) is LastRequestConnection
            and connection.our_state is h11.SEND_BODY
            and type(connection._writer) is h11._writers.ChunkedWriter
        )

    async def finish(self, data: bytes) -> None:
        """`data` and the body's end (the terminating chunk) in one write, then what hypercorn does
        at a response's end (`HTTPStream._send_closed`): its access log, and the stream closed,
        which readies the connection for its next request or closes it. Only after `can_finish`;
        the caller shields it (the end must be recorded even as its request is cancelled)."""
        connection = self._connection
        protocol = connection._http11
        assert protocol is not None
        frame = b"%x\r\n%b\r\n0\r\n\r\n" % (len(data), data) if data else b"0\r\n\r\n"
        await _end_directly(connection, protocol, cast(HTTPStream, protocol.stream), frame)

    async def write_last(self, data: bytes, end: Callable[[], Awaitable[None]]) -> None:
        """`data`, then the body's end by `end` (the ASGI message after which h11 writes the
        terminating chunk), in one send: the frame is held by the connection and goes out with
        the next bytes hypercorn writes, or before any other event it sends (a close), or at the
        latest when `end` returns."""
        connection = self._connection
        if data:
            connection._held += b"%x\r\n%b\r\n" % (len(data), data)
        try:
            await end()
        finally:
            held, connection._held = connection._held, b""
            if held:  # hypercorn wrote nothing more (the client went away meanwhile)
                with trio.CancelScope(shield=True):  # bounded by the write timeout
                    await connection._write(held)


async def start_direct_response(
    scope: dict[str, Any], status: int, headers: list[tuple[bytes, bytes]]
) -> DirectBody | None:
    """Write the head of the response to `scope`'s request straight to its connection, and return
    the writer of its body; None, with nothing written, where the response is not the common streamed one
    (`HTTP11Protocol.direct_head`) or the server is not `trio-direct serve`'s (plain hypercorn),
    and it then goes through ASGI as usual.

    For a 2xx with no Content-Length to an HTTP/1.1 client on a kept-alive connection. The head is
    h11's, byte for byte (headers validated by h11's own patterns, hypercorn's Date and Server
    headers, ``Transfer-Encoding: chunked``), and h11's and hypercorn's states move as their own
    sends move them.
    """
    found = _unanswered_request(scope)
    if found is None:
        return None
    connection, protocol, stream = found
    head = protocol.direct_head(status, headers)
    if head is None:
        return None
    stream.response = {"type": "http.response.start", "status": status, "headers": headers}
    stream.state = ASGIHTTPState.RESPONSE
    # Written now rather than with the first events: holding it saved no measurable CPU and cost a
    # client ~0.15 ms of time to first token, parsing the head on that token's path (measured).
    await connection._write(head)
    return DirectBody(connection)


async def send_direct_response(
    scope: dict[str, Any], status: int, headers: list[tuple[bytes, bytes]], body: bytes
) -> bool:
    """Write a whole response of declared length (a JSON answer: `headers` declare `body`'s length
    as ``Content-Length``) straight to the connection of `scope`'s request, head and body in one
    write, and end it as hypercorn ends one (`DirectBody.finish`); False, with nothing written,
    where `start_direct_response` would refuse it, and it then goes through ASGI as usual.

    Through ASGI the same response costs two messages through hypercorn's layers, three h11 events
    and two writes. The caller shields it, as it shields any response's end.
    """
    found = _unanswered_request(scope)
    if found is None:
        return False
    connection, protocol, stream = found
    head = protocol.direct_head(status, headers, length=len(body))
    if head is None:
        return False
    stream.response = {"type": "http.response.start", "status": status, "headers": headers}
    await _end_directly(connection, protocol, stream, head + body)
    return True


def _unanswered_request(scope: dict[str, Any]) -> tuple[GuardedConnection, HTTP11Protocol, HTTPStream] | None:
    """The connection, protocol and stream of `scope`'s request under `trio-direct serve`, where it
    is the connection's current request and no response to it began; None otherwise (plain
    hypercorn, an HTTP/2 preface answered, a response under way or over)."""
    connection = _current_connection.get()
    if connection is None:
        return None
    protocol = connection._http11
    if protocol is None or cast(HTTP11Only, connection.protocol).refused:
        return None
    stream = protocol.stream
    if type(stream) is not HTTPStream or stream.scope is not scope:
        return None
    if stream.closed or stream.state is not ASGIHTTPState.REQUEST:
        return None
    return connection, protocol, stream


async def _end_directly(
    connection: GuardedConnection, protocol: HTTP11Protocol, stream: HTTPStream, last: bytes
) -> None:
    """End the response `last` ends (its last bytes, written here in one write) as hypercorn ends
    one (`HTTPStream._send_closed`): h11's state at the end of the message, the access log, and the
    stream closed, which readies the connection for its next request or closes it."""
    cast(LastRequestConnection, protocol.connection).send_without_writing(h11.EndOfMessage())
    stream.state = ASGIHTTPState.CLOSED
    await connection._write(last)
    await stream.config.log.access(stream.scope, stream.response, time.time() - stream.start_time)
    await stream.send(StreamClosed(stream_id=stream.stream_id))


def direct_body_writer() -> DirectBody | None:
    """A writer of the current response's body straight to the connection, or None.

    Offered under `trio-direct serve` (`GuardedConnection`) once a response's head went out with
    chunked framing (an HTTP/1.1 response without Content-Length). Under plain hypercorn
    (`hypercorn trio_direct.app:app`) it is None, and bodies go through ASGI.
    """
    connection = _current_connection.get()
    if connection is None:
        return None
    wrapper = getattr(connection, "protocol", None)
    if not isinstance(wrapper, HTTP11Only):
        return None
    h11_connection = wrapper.protocol.connection
    if not isinstance(h11_connection, h11.Connection) or h11_connection.our_state is not h11.SEND_BODY:
        return None
    if not isinstance(h11_connection._writer, h11._writers.ChunkedWriter):
        return None  # not chunked (an HTTP/1.0 client gets a body delimited by the connection's close)
    return DirectBody(connection)


#: What the app receives once its queue was closed (`_AppQueue.put`): the client is gone, or its request over.
_DISCONNECT = {"type": "http.disconnect"}


class _AppQueue:
    """One request's ASGI queue: hypercorn puts the request's body and its disconnect, the app takes.

    `put` and `take` are `channel.send` and `channel.receive` that yield to the scheduler only when
    they must wait (each is still a checkpoint for cancellation): a body and a disconnect reach the
    app without a task switch apiece.

    A disconnect never waits: on a full queue it closes the channel instead, which the app sees as
    the disconnect once it has taken what is queued. Waiting there can last forever: hypercorn
    queues the disconnect when the response has ended, from the app's own task when the app ends
    its answer, and an app that answered without reading a body that filled its queue (a 401 after
    a key lookup, while the upload went on) would wait for itself, with the connection's read loop
    waiting behind it to queue the next piece of the body. Any message after the close is dropped.

    A disconnect also cancels the scope the app handed to `cancel_on_disconnect`, at once: the app
    then needs no task of its own reading the queue for it.
    """

    __slots__ = ("_to_app", "_from_client", "_disconnected", "_watching")

    def __init__(self, size: float) -> None:
        self._to_app, self._from_client = trio.open_memory_channel[Any](size)
        self._disconnected = False
        self._watching: trio.CancelScope | None = None

    async def put(self, message: Any) -> None:
        await trio.lowlevel.checkpoint_if_cancelled()
        disconnect = message["type"] == "http.disconnect"
        if disconnect:
            self._disconnected = True
            if self._watching is not None:
                self._watching.cancel()
        channel = self._to_app
        try:
            try:
                channel.send_nowait(message)
            except trio.WouldBlock:
                if disconnect:
                    channel.close()
                else:
                    await channel.send(message)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            pass  # the disconnect closed the queue, or the app is gone

    async def take(self) -> Any:
        await trio.lowlevel.checkpoint_if_cancelled()
        channel = self._from_client
        try:
            try:
                return channel.receive_nowait()
            except trio.WouldBlock:
                return await channel.receive()
        except trio.EndOfChannel:
            return dict(_DISCONNECT)

    def watch(self, scope: trio.CancelScope | None) -> None:
        self._watching = scope
        if scope is not None and self._disconnected:
            scope.cancel()


def cancel_on_disconnect(receive: Callable[[], Awaitable[Any]], scope: trio.CancelScope | None) -> bool:
    """Have the connection cancel `scope` when the client behind `receive` disconnects (None: stop).

    For an app that has read its request's body and has nothing more to take from `receive` but
    the disconnect: it needs no task waiting on `receive` for it (a task, its spawn and its
    cancellation per request). A disconnect already queued cancels `scope` at once. False where
    `receive` is not this server's (plain hypercorn): the app then watches with a task of its own.
    """
    queue = getattr(receive, "__self__", None)
    if type(queue) is not _AppQueue:
        return False
    queue.watch(scope)
    return True


class AppTaskGroup(TaskGroup):
    """hypercorn's task group, with the app's receive channel an `_AppQueue`: a request's body and
    its disconnect reach the app without a task switch apiece, a disconnect never waits for room in
    the queue, and it cancels what the app asked it to (`cancel_on_disconnect`)."""

    async def spawn_app(
        self, app: AppWrapper, config: Config, scope: Any, send: Callable[[Any], Awaitable[None]]
    ) -> Callable[[Any], Awaitable[None]]:
        queue = _AppQueue(config.max_app_queue_size)
        assert self._nursery is not None
        self._nursery.start_soon(
            _handle, app, config, scope, queue.take, send, trio.to_thread.run_sync, trio.from_thread.run
        )
        return queue.put


class LastRequestConnection(h11.Connection):
    """h11's server side, quiet about bytes after the last request a connection will carry.

    Once the client's request is complete on a connection that closes after the answer (either
    side said ``Connection: close``), h11 raises a protocol error on any further byte, and hypercorn
    then closes the connection in the middle of the answer. A request smuggled behind a
    ``Content-Length`` + ``Transfer-Encoding`` one would cut that request's 400 short that way.
    Here such bytes are left unread until the connection closes.
    """

    def next_event(self) -> Any:
        if self.their_state is h11.MUST_CLOSE and self.trailing_data[0]:
            return h11.NEED_DATA
        return super().next_event()

    def send_without_writing(self, event: Any) -> None:
        """`send(event)` for an event whose bytes the caller writes itself (`start_direct_response`,
        `DirectBody.finish`): the state machine moves, and its writer for the body is chosen, as
        `send` moves them, and a refused event leaves the connection in ERROR as there."""
        if self.our_state is h11.ERROR:
            raise h11.LocalProtocolError("Can't send data when our state is ERROR")
        try:
            self._process_event(self.our_role, event)
        except BaseException:
            self._process_error(self.our_role)
            raise

    def _get_io_object(self, role: Any, event: Any, io_dict: Any) -> Any:
        reader = super()._get_io_object(role, event, io_dict)
        if type(reader) is h11._readers.ChunkedReader:
            return _StrictChunkedReader()
        return reader

    def _clean_up_response_headers_for_sending(self, response: h11.Response) -> h11.Response:
        """h11's, without re-validating the headers it already validated, for the usual response of
        unknown length (a stream) to an HTTP/1.1 client on a kept-alive connection.

        h11 adds ``Transfer-Encoding: chunked`` there after dropping any Content-Length, each step
        (`set_comma_header`) validating every header anew: ~20 µs per streamed response. With
        neither header present (the body framing h11 finds is then "http/1.0") nothing is dropped,
        and the result is the validated headers plus that one, as built here. Any other response
        goes through h11's own steps.
        """
        method = cast(bytes, self._request_method)  # set with the request, as h11 has it
        version = self.their_http_version
        if (
            self._cstate.keep_alive
            and version is not None
            and version >= b"1.1"
            and _body_framing(b"GET" if method == b"HEAD" else method, response)[0] == "http/1.0"
        ):
            headers = h11._headers.Headers([*response.headers._full_items, _CHUNKED])
            return h11.Response(
                headers=headers,
                status_code=response.status_code,
                http_version=response.http_version,
                reason=response.reason,
            )
        return super()._clean_up_response_headers_for_sending(response)


#: The most request-body bytes read and thrown away after an answer that did not wait for them; a
#: longer body closes the connection instead (reading it would cost more than a new connection).
EARLY_ANSWER_DISCARD_LIMIT = 1 << 20


class _UnreadBody:
    """The stream of a request whose answer has ended before its body was read: it takes the rest
    of the body from hypercorn's event loop and drops it, and at the body's end readies the
    connection for its next request; past `EARLY_ANSWER_DISCARD_LIMIT` it closes the connection.

    It stands where hypercorn would leave no stream, so that no piece of the body, its end
    included, is taken from h11 and lost: hypercorn's loop stops at such a piece, and an end lost
    there would leave the connection waiting for nothing.
    """

    __slots__ = ("_budget", "_protocol")

    def __init__(self, protocol: HTTP11Protocol) -> None:
        self._protocol = protocol
        self._budget = EARLY_ANSWER_DISCARD_LIMIT

    async def handle(self, event: Any) -> None:
        if self._budget < 0:
            return  # given up: the connection is closing
        if isinstance(event, Body):
            self._budget -= len(event.data)
            if self._budget < 0:
                await self._protocol.send(Closed())
        elif isinstance(event, EndBody):
            self._budget = -1
            await self._protocol._recycle()


class HTTP11Protocol(H11Protocol):
    """hypercorn's HTTP/1.1 protocol, without its switch to HTTP/2 on ``Upgrade: h2c``, and with the
    rest of a request's body read past after an answer that did not wait for it.

    An app may answer before reading the body (401 for a missing key, 404, a refusal). hypercorn
    then drops the request's stream and closes the connection, or, when the body's events come
    after the answer's end, stops handling events at the body's next piece and never readies the
    connection for its next request. Both surprise a keep-alive client, whose next request on the
    connection fails (or waits until the connection times out), and the answer said nothing of a
    close. The answer ends before the body's events were taken from h11 whenever the body arrives
    after the answer, and often otherwise, since the app here runs without a task switch
    (`AppTaskGroup`). Here the rest of the body is read and discarded (`_UnreadBody`), under the
    body read deadlines, and the connection recycled at its end. A body that declares more than
    `EARLY_ANSWER_DISCARD_LIMIT` still to come gets ``Connection: close`` on the answer and is not
    read; a chunked one that runs past the limit closes the connection.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        limit = self.config.h11_max_incomplete_size
        self.connection = LastRequestConnection(h11.SERVER, max_incomplete_event_size=limit)

    async def stream_send(self, event: StreamEvent) -> None:
        if (
            type(event) is Response
            and event.status_code >= 200
            and self.connection.their_state is h11.SEND_BODY
            and getattr(self.connection._reader, "_remaining", 0) > EARLY_ANSWER_DISCARD_LIMIT
        ):
            # An answer before a long declared body: the client is told not to reuse the connection.
            headers = [*event.headers, (b"connection", b"close")]
            event = Response(stream_id=event.stream_id, headers=headers, status_code=event.status_code)
        await super().stream_send(event)

    def direct_head(self, status: int, headers: list[tuple[bytes, bytes]], length: int | None = None) -> bytes | None:
        """The head h11 would write for this response (after hypercorn's `stream_send` adds its
        headers and our `LastRequestConnection` its chunked framing), with h11's state moved as
        its `send` moves it; None, with nothing moved, unless it is the common streamed response:
        a 2xx or 3xx with a body (not 204, 304 or HEAD's) and no Content-Length, Transfer-Encoding
        or Connection header, to an HTTP/1.1 request read whole, on a connection that stays
        alive. Headers are stripped as hypercorn strips them and checked by h11's own patterns;
        one that fails (or a pseudo-header) leaves the response to ASGI, which refuses it as
        before.

        With `length`, the head of a whole body of that many bytes instead: the headers must then
        declare it, once, as ``Content-Length``, and the head has no chunked framing (h11 adds
        none to a response of declared length)."""
        connection = self.connection
        if (
            type(connection) is not LastRequestConnection
            or not 200 <= status < 1000
            or status in (204, 304)
            or connection.our_state is not h11.SEND_RESPONSE
            or connection.their_state is not h11.DONE
            or connection.their_http_version != b"1.1"
            or not connection._cstate.keep_alive
            or connection._request_method == b"HEAD"
            or self.keep_alive_requests >= self.config.keep_alive_max_requests
        ):
            return None
        items: list[tuple[bytes, bytes, bytes]] = []
        lines: list[bytes] = [b"HTTP/1.1 %d \r\n" % status]
        declared = None if length is None else b"%d" % length
        for name, value in headers:
            if type(name) is not bytes or type(value) is not bytes:
                return None
            name, value = name.strip(), value.strip()
            lower = name.lower()
            if declared is not None and lower == b"content-length" and value == declared:
                declared = None  # declared once, as the body's length (h11 checks the body against it)
            elif (
                lower in _DIRECT_HEAD_EXCLUDED
                or name.startswith(b":")
                or _FIELD_NAME.fullmatch(name) is None
                or _FIELD_VALUE.fullmatch(value) is None
            ):
                return None
            items.append((name, lower, value))
            lines.append(b"%s: %s\r\n" % (name, value))
        if declared is not None:
            return None  # the length was not declared, or not as the body's
        for name, value in self.config.response_headers("h11"):
            items.append((name, name.lower(), value))
            lines.append(b"%s: %s\r\n" % (name, value))
        if length is None:
            items.append(_CHUNKED)
            lines.append(b"Transfer-Encoding: chunked\r\n\r\n")
        else:
            lines.append(b"\r\n")
        response = h11.Response(headers=h11._headers.Headers(items), status_code=status, _parsed=True)
        connection.send_without_writing(response)
        return b"".join(lines)

    async def _maybe_recycle(self) -> None:
        connection = self.connection
        if (
            connection.our_state is h11.DONE
            and connection.their_state is h11.SEND_BODY
            and not self.context.terminated.is_set()
        ):
            await self._close_stream()
            # The body's rest, already buffered or still to come, reaches it from the read loop's
            # next `_handle_events`, or from the one under way (waiting to hand the app a piece).
            self.stream = _UnreadBody(self)  # type: ignore[assignment]
            return
        await super()._maybe_recycle()

    async def _recycle(self) -> None:
        """The discarded body has ended: both sides are done, ready for the next request."""
        self.stream = None
        await super()._maybe_recycle()

    async def _check_protocol(self, event: h11.Request) -> None:
        if event.method == b"PRI" and event.target == b"*" and event.http_version == b"2.0":
            raise H2ProtocolAssumedError(b"")  # `HTTP11Only` answers it
        if event.method != event.method.upper():
            raise MethodNotUpperCase()  # `HTTP11Only` answers it


class HTTP11Only(ProtocolWrapper):
    """`ProtocolWrapper`'s place in `TCPServer`, for HTTP/1.1 alone: an HTTP/2 preface gets 505."""

    def __init__(self, protocol: HTTP11Protocol, send: Callable[[Event], Awaitable[None]]) -> None:
        self.protocol = protocol
        self.send = send
        self.refused = False

    async def initiate(self) -> None:
        await self.protocol.initiate()

    async def handle(self, event: Event) -> None:
        if self.refused:
            return
        try:
            await self.protocol.handle(event)
        except H2ProtocolAssumedError:
            self.refused = True
            await self.send(RawData(responses.http2_not_supported()))
            await self.send(Closed())
        except MethodNotUpperCase:
            self.refused = True
            await self.send(RawData(responses.method_not_upper_case()))
            await self.send(Closed())


class GuardedConnection(TCPServer):
    """A plain-TCP client connection under `ConnectionLimits`' deadlines."""

    def __init__(
        self,
        app: AppWrapper,
        config: Config,
        context: WorkerContext,
        state: ConnectionState,
        stream: trio.SocketStream,
        limits: ConnectionLimits,
    ) -> None:
        super().__init__(app, config, context, state, stream)  # type: ignore[arg-type]
        self.limits = limits
        self._reading = trio.CancelScope()
        self._reader: trio.lowlevel.Task | None = None
        self._stop_reading = False
        self._linger = False
        #: The read loop has ended: the client is gone (or was sent away), nothing is kept alive.
        self._read_ended = False
        #: Bytes that go out with the next write, or before any other event hypercorn sends: a
        #: body's last chunk until h11's end of it (`DirectBody.write_last`).
        self._held = b""
        #: The HTTP/1.1 protocol while the connection runs (`start_direct_response`, `DirectBody`).
        self._http11: HTTP11Protocol | None = None
        #: Keep-alive (`_watch_idle`): between requests (and before the first), the deadline by
        #: which the next request must begin, and the watcher's scope that carries it.
        self._idle = True
        self._idle_deadline = math.inf
        self._idle_scope: trio.CancelScope | None = None
        self._idle_watch_ended = False

    async def run(self) -> None:
        """`TCPServer.run` without TLS, with `HTTP11Only` as the protocol."""
        socket = self.stream.socket
        _current_connection.set(self)  # this task's own context: its request tasks inherit it
        try:
            client = parse_socket_addr(socket.family, socket.getpeername())
            server = parse_socket_addr(socket.family, socket.getsockname())
            async with AppTaskGroup() as task_group:
                self._task_group = task_group
                http11 = HTTP11Protocol(
                    self.app, self.config, self.context, task_group, ConnectionState(self.state),
                    False, client, server, self.protocol_send,
                )  # fmt: skip
                self.protocol = HTTP11Only(http11, self.protocol_send)
                self._http11 = http11
                await self.protocol.initiate()
                self._set_idle(True)
                task_group.spawn(self._watch_idle)
                await self._read_data()
        except OSError:
            pass
        finally:
            try:
                await self._shut_down()
            finally:
                # The protocol holds our bound methods: without this, every connection would be left
                # for the garbage collector's cycle detection (and reach its old generation under load).
                vars(self).pop("protocol", None)
                self._http11 = None
                self._reader = None

    async def _read_data(self) -> None:
        deadlines = ReadDeadlines(self.limits, trio.current_time())
        self._reader = trio.lowlevel.current_task()
        with self._reading:
            while not self._stop_reading:
                their_state, buffered = self._peer()
                phase, deadline = deadlines.next_read(their_state, buffered, trio.current_time())
                with trio.move_on_at(deadline) as read:
                    try:
                        data = await self.stream.receive_some(MAX_RECV)
                    except (trio.ClosedResourceError, trio.BrokenResourceError):
                        break
                if read.cancelled_caught:
                    await self._time_out(phase, buffered)
                    break
                if data and self._peer()[0] is h11.MUST_CLOSE:
                    # The client's last request is read and the connection closes after its answer:
                    # h11 would call further bytes a protocol error, and hypercorn would then cut
                    # the answer short. They are discarded instead.
                    continue
                await self.protocol.handle(RawData(bytes(data)))
                if data == b"":
                    break
        self._read_ended = True
        if self._linger:
            await self._discard_until_client_closes()
        await self.protocol.handle(Closed())
        # The client is gone (or was sent away): nothing is left for the keep-alive timer to close.
        self._stop_watching_idle()

    async def protocol_send(self, event: Event) -> None:
        """hypercorn's, with a deadline on writes without progress, and no keep-alive timer started
        once the read loop has ended (a client that reset while its answer's end was written)."""
        if isinstance(event, RawData):
            await self._write(event.data)  # after what is held (`_write`)
            return
        if self._held:  # held bytes go out before any other event (a close)
            await self._write(b"")
        if isinstance(event, Updated):
            if not (event.idle and self._read_ended):
                self._set_idle(event.idle)
        else:
            await super().protocol_send(event)

    def _set_idle(self, idle: bool) -> None:
        """A request began (not idle), or the connection waits for the next one: the keep-alive
        deadline runs from now."""
        self._idle = idle
        deadline = trio.current_time() + self.config.keep_alive_timeout if idle else math.inf
        self._idle_deadline = deadline
        if self._idle_scope is not None:
            self._idle_scope.deadline = deadline

    def _stop_watching_idle(self) -> None:
        self._idle = False
        self._idle_watch_ended = True
        if self._idle_scope is not None:
            self._idle_scope.cancel()

    async def _watch_idle(self) -> None:
        """hypercorn's keep-alive timer (`TCPServer._idle_timeout`), one task for the connection:
        an idle connection closes once its keep-alive deadline passes, or at once when the server
        shuts down (a busy one closes after its answer, hypercorn's `_maybe_recycle` sees to it)."""
        terminated = self.context.terminated
        while True:
            with trio.CancelScope(deadline=self._idle_deadline) as scope:
                self._idle_scope = scope
                await terminated.wait()
            self._idle_scope = None
            if self._idle_watch_ended:
                return
            if self._idle:
                break
            if terminated.is_set():
                return
            # The deadline passed as a request began: watch that request's connection on.
        with trio.CancelScope(shield=True):
            await self._initiate_server_close()

    async def _write(self, data: bytes) -> None:
        """`data` to the client, after the bytes held for the next write (`_held`)."""
        held = self._held
        if held:
            self._held = b""
            data = held + data
        elif not data:
            return
        lock = self.send_lock
        await trio.lowlevel.checkpoint_if_cancelled()  # what acquiring the lock checks first
        try:
            lock.acquire_nowait()
        except trio.WouldBlock:
            await lock.acquire()
        try:
            # The common case, a socket with room: the bytes go now, without a task switch, a timer
            # and the layers of a trio `send_all`. Anything else (a full socket, an error) takes the
            # guarded path with what is left, where an error is raised as `send_all` raises it.
            sent = 0
            fd = self.stream.socket.fileno()
            if fd >= 0:
                try:
                    sent = os.write(fd, data)
                except OSError:
                    sent = 0
            closed = sent < len(data) and await self._write_guarded(data[sent:] if sent else data)
        finally:
            lock.release()
        if closed:
            await self.protocol.handle(Closed())  # the app sees the client gone: its engine request ends

    async def _write_guarded(self, data: bytes) -> bool:
        """Write `data` (under the send lock); True when the client is gone or made no progress for
        the write timeout, and the connection was closed."""
        timeout = self.limits.client_write_timeout
        stalled = gone = False
        try:
            view = memoryview(data)
            for start in range(0, len(view), _WRITE_SLICE):
                # Shielded as hypercorn has it (a cancelled write would leave a partial chunk on the
                # wire), but bounded: a client that reads nothing for `timeout` is not waited for.
                with trio.CancelScope(shield=True, deadline=trio.current_time() + timeout) as scope:
                    await self.stream.send_all(view[start : start + _WRITE_SLICE])
                if scope.cancelled_caught:
                    stalled = True
                    break
        except (trio.BrokenResourceError, trio.ClosedResourceError) as error:
            # The client is gone. Nothing awaits inside this block, and the error's chain
            # drops its tracebacks: on Python 3.13 the socket's OSError, translated in a
            # generator context manager, and `contextlib`'s `__exit__` frame hold each other,
            # and through the frames' callers this connection, until a full collection.
            _drop_tracebacks(error)
            del error
            gone = True
        if stalled:
            HTTP_WRITE_TIMEOUTS.inc()
            self._linger = False
            await trio.aclose_forcefully(self.stream)  # the read loop ends on it too
        return stalled or gone

    async def _half_close(self) -> None:
        """`SocketStream.send_eof` for a peer that may be gone, without a reference cycle: trio
        translates the socket's OSError (ENOTCONN once the client reset) in a generator context
        manager, and on Python 3.13 that OSError's traceback and `contextlib`'s `__exit__` frame
        hold each other, and with them this connection's frames, until a full collection."""
        await trio.lowlevel.checkpoint()
        socket = self.stream.socket
        if not socket.did_shutdown_SHUT_WR:
            try:
                socket.shutdown(SHUT_WR)
            except OSError:
                pass  # the peer is gone: nothing left to half-close

    async def _shut_down(self) -> None:
        """hypercorn's `TCPServer._close` (half-close, then close), through `_half_close`."""
        await self._half_close()
        await self.stream.aclose()

    async def _close(self) -> None:
        """hypercorn ends the connection (after a ``Connection: close`` answer, or an error answer).

        The answer is delivered with a half-close; the socket closes once the client closed its
        side or `LINGER_TIME` passed, reading and discarding what it still sends meanwhile. Closing
        at once with unread bytes would reset the connection, and a reset makes the client's
        system drop the answer it has not read yet (a 413 sent before the body, a 400 to a bad
        request). The read loop stops handing bytes to hypercorn either way; when hypercorn closes
        from another task (after an answer), the read loop is cancelled, since it may be parked on
        a pipelined request that will never run. The half-close waits for a write in progress
        (hypercorn's own `_close` does not, and a write it overlaps fails with a traceback).
        """
        self._linger = self._peer()[0] is not h11.CLOSED
        try:
            with trio.move_on_after(_SEND_TIMEOUT) as waiting:
                async with self.send_lock:
                    if self._linger:
                        await self._half_close()
                    else:
                        await self._shut_down()
            if waiting.cancelled_caught:  # a write is stuck on a client that does not read
                self._linger = False
                await self.stream.aclose()
        except (trio.BrokenResourceError, trio.BusyResourceError, trio.ClosedResourceError):
            self._linger = False
            await self.stream.aclose()
        finally:
            if trio.lowlevel.current_task() is self._reader:
                self._stop_reading = True  # hypercorn's read handling closes: let it finish, then stop
            else:
                self._reading.cancel()

    async def _discard_until_client_closes(self) -> None:
        with trio.move_on_after(LINGER_TIME):
            while True:
                try:
                    if not await self.stream.receive_some(MAX_RECV):
                        return
                except (trio.ClosedResourceError, trio.BrokenResourceError):
                    return

    def _peer(self) -> tuple[object, bool]:
        """The client's h11 state, and whether h11 holds bytes of a request it has not parsed."""
        connection = self.protocol.protocol.connection
        if not isinstance(connection, h11.Connection):
            return None, False  # switched to WebSocket to answer the handshake
        return connection.their_state, bool(connection.trailing_data[0])

    async def _time_out(self, phase: ReadPhase, head_buffered: bool) -> None:
        """Answer a stalled request 408 unless a response already began, then close at once."""
        HTTP_TIMEOUTS.labels(phase.value).inc()
        if phase is ReadPhase.HEAD:
            answer = responses.header_timeout(self.limits.header_read_timeout) if head_buffered else None
        else:
            answer = responses.body_timeout(self.limits.body_read_timeout, self.limits.body_total_timeout)
        connection = self.protocol.protocol.connection
        async with self.send_lock:
            # Under the lock: no response bytes are on their way while our state says none began.
            unanswered = isinstance(connection, h11.Connection) and connection.our_state in _NOTHING_SENT
            if answer is not None and unanswered:
                with trio.move_on_after(_SEND_TIMEOUT), suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                    await self.stream.send_all(answer)
            await self.stream.aclose()


__all__ = [
    "AppTaskGroup",
    "DirectBody",
    "GuardedConnection",
    "cancel_on_disconnect",
    "HTTP11Only",
    "HTTP11Protocol",
    "LastRequestConnection",
    "direct_body_writer",
    "send_direct_response",
    "start_direct_response",
]
