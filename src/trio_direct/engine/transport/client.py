"""An engine's HTTP/2 connections and the calls trio code makes on them.

Each engine gets several connections: one for control (unary) calls, so a health check or an
`Abort` never waits behind generations, and as many for request work (generation streams, `Embed`
calls) as the peer's SETTINGS_MAX_CONCURRENT_STREAMS needs (past it grpclib queues a new stream
until another closes).
A stream's whole call is one asyncio task; its messages reach trio through a memory channel.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import trio
from grpclib.client import Channel
from grpclib.client import Handler as ClientHandler
from grpclib.config import Configuration
from grpclib.const import Cardinality
from grpclib.exceptions import GRPCError, ProtocolError, StreamTerminatedError
from grpclib.protocol import H2Protocol
from h2.events import RemoteSettingsChanged
from h2.utilities import SizeLimitDict

from trio_direct.engine.errors import (
    EngineDeadlineExceeded,
    EngineError,
    EngineUnavailable,
    StreamWakeup,
    error_for_status,
)
from trio_direct.engine.transport.loop import aio, current_loop, settled

__all__ = ["HTTP2_CONFIG", "ChannelPool", "EngineChannel", "MessageStream", "client_config"]

#: Larger HTTP/2 windows than grpclib's defaults: prompts of many thousand token ids and fast token
#: streams should never wait on flow-control updates.
HTTP2_CONFIG = Configuration(
    http2_connection_window_size=16 * 1024 * 1024,
    http2_stream_window_size=4 * 1024 * 1024,
)

#: HTTP/2 keepalive pings to engines: defaults that never trip a stock grpcio server's ping policy.
#: grpcio answers a ping that comes sooner than ``grpc.http2.min_ping_interval_without_data_ms``
#: (5 minutes) after the previous one, while it sent no data itself, with a strike, and the third
#: strike with GOAWAY ``too_many_pings``, which ends every stream on the connection. A connection
#: whose streams all wait in the engine's queue, or on a long prefill, sends no data for minutes:
#: pinging it every few seconds is what made smg's gateway kill long generations.
DEFAULT_KEEPALIVE_INTERVAL = 360.0
DEFAULT_KEEPALIVE_TIMEOUT = 20.0


def client_config(
    keepalive_interval: float = DEFAULT_KEEPALIVE_INTERVAL, keepalive_timeout: float = DEFAULT_KEEPALIVE_TIMEOUT
) -> Configuration:
    """The HTTP/2 settings of connections to engines: `HTTP2_CONFIG`'s windows, and a ping every
    `keepalive_interval` seconds while calls are open (0: none); one unanswered for
    `keepalive_timeout` seconds closes the connection, failing its calls as unavailable.

    grpclib spaces pings by ``_http2_min_sent_ping_interval_without_data`` too, and by default stops
    after two pings without a request sent: both follow the interval here, so that a dead engine is
    still noticed on a connection that only receives (a long generation sends nothing upstream).
    """
    if keepalive_interval <= 0:
        return HTTP2_CONFIG
    return Configuration(
        _keepalive_time=keepalive_interval,
        _keepalive_timeout=keepalive_timeout,
        _keepalive_permit_without_calls=False,
        _http2_max_pings_without_data=0,
        _http2_min_sent_ping_interval_without_data=keepalive_interval,
        http2_connection_window_size=HTTP2_CONFIG.http2_connection_window_size,
        http2_stream_window_size=HTTP2_CONFIG.http2_stream_window_size,
    )


#: The stream limit assumed for a peer whose SETTINGS never came; h2 and grpclib servers advertise 100.
_DEFAULT_STREAM_LIMIT = 100

#: Closed streams whose end h2 remembers per connection (h2's default: 65,536).
_CLOSED_STREAMS_REMEMBERED = 1024

#: How long leaving a stream early waits for its asyncio task to reset the stream and end.
_CANCEL_SETTLE_TIMEOUT = 5.0

#: Why a call to an engine that left the fleet fails.
_RETIRED = "engine removed from the fleet"

#: Stream connections per engine at most (3,200 streams at a limit of 100, more than an engine runs).
_MAX_STREAM_CONNECTIONS = 32
#: Messages of one stream held for a reader that is behind; the call stops reading past this
#: (checked every `_BUFFER_POLL` seconds while full).
STREAM_BUFFER = 64
_BUFFER_POLL = 0.01


class _Failure:
    """A terminal error travelling through a stream's channel, raised at the reader (None: a wake-up)."""

    __slots__ = ("error",)

    def __init__(self, error: EngineError | None) -> None:
        self.error = error


class MessageStream:
    """Messages of one server-streaming call, read from trio.

    Iterating yields protobuf messages; the call's failure is raised by the iteration at the point
    the stream broke, after every message that arrived before it.

    `written` is set once the request is on the wire (or the call failed before that): what the
    caller does after sending, such as writing its own client's response headers, waits for it
    instead of guessing how many scheduling rounds the asyncio side needs.
    """

    __slots__ = ("_receive", "_send", "written")

    def __init__(
        self, receive: trio.MemoryReceiveChannel, written: trio.Event, send: trio.MemorySendChannel | None = None
    ) -> None:
        self._receive = receive
        #: The call's own sending end (closed by the call when it ends): how `fail` and `wake` reach
        #: a reader waiting for the next message, at no cost to the messages themselves.
        self._send = send
        self.written = written

    def __aiter__(self) -> MessageStream:
        return self

    async def __anext__(self) -> Any:
        try:
            item = await self._receive.receive()
        except trio.EndOfChannel:
            raise StopAsyncIteration from None
        if type(item) is _Failure:
            if item.error is None:
                raise StreamWakeup
            raise item.error
        return item

    def receive_nowait(self) -> Any:
        """Next already-arrived message, for coalescing; raises trio.WouldBlock when none."""
        item = self._receive.receive_nowait()
        if type(item) is _Failure:
            if item.error is None:
                raise trio.WouldBlock  # a wake-up is moot while messages are being read
            raise item.error
        return item

    def fail(self, error: EngineError) -> bool:
        """End the stream with `error` for its reader, after what already arrived (a hung engine);
        False when the call already ended."""
        return self._inject(_Failure(error))

    def wake(self) -> bool:
        """Have a reader waiting for the next message raise `StreamWakeup` (it reads on after);
        False when the call already ended."""
        return self._inject(_Failure(None))

    def _inject(self, item: _Failure) -> bool:
        if self._send is None:
            return False
        try:
            self._send.send_nowait(item)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            return False
        return True


class _ClientProtocol(H2Protocol):
    """grpclib's client protocol, reporting the peer's stream limit whenever its SETTINGS arrive."""

    def __init__(self, *args: Any, report: Callable[[int | None], None]) -> None:
        super().__init__(*args)
        self._report = report

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.writer = _CoalescingTransport(transport)
        super().connection_made(self.writer)  # type: ignore[arg-type]
        h2_connection = self.connection._connection  # grpclib's h2 connection
        # h2 remembers how each closed stream ended, 65,536 per connection, so that a frame arriving
        # after a reset is ignored rather than answered; at thousands of requests a minute that record
        # grows the heap by ~8 MB per connection before it levels off. The recent ones are enough.
        h2_connection._closed_streams = SizeLimitDict(size_limit=_CLOSED_STREAMS_REMEMBERED)
        processors = self.processor.processors
        # grpclib infers its processors as dict[type, function], which the checker cannot call
        process: Callable[[RemoteSettingsChanged], None] = processors[RemoteSettingsChanged]  # type: ignore[assignment]
        peer_settings = h2_connection.remote_settings

        def settings_changed(event: RemoteSettingsChanged) -> None:
            process(event)
            self._report(peer_settings.max_concurrent_streams)  # h2: 2**32+1 when the peer sets none

        processors[RemoteSettingsChanged] = settings_changed

    def connection_lost(self, exc: BaseException | None) -> None:
        super().connection_lost(exc)
        self._report(None)  # wakes a stream waiting for SETTINGS that will never come


class _CoalescingTransport:
    """The socket transport, with the writes of one event-loop turn sent as one.

    grpclib writes a request's HEADERS and DATA frames separately; each send to an idle engine
    process wakes it, which costs ~0.5 ms on a virtual machine with idle CPUs. Buffered until the
    loop's next turn (no timer), or until `flush()` once a whole request is written, a request
    leaves in one send, and under load many streams' frames share one.
    """

    __slots__ = ("_transport", "_pending", "_loop")

    def __init__(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport
        self._pending: list[bytes] = []
        self._loop = asyncio.get_running_loop()

    def write(self, data: bytes) -> None:
        if not data:
            return
        if not self._pending:
            self._loop.call_soon(self.flush)
        self._pending.append(data)

    def flush(self) -> None:
        if self._pending:
            data = b"".join(self._pending)
            self._pending.clear()
            if not self._transport.is_closing():
                self._transport.write(data)  # type: ignore[attr-defined]

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def _retrieve(task: asyncio.Task) -> None:
    if not task.cancelled():
        task.exception()


class _Connection(Channel):
    """One HTTP/2 connection to an engine, with the count of streams this client has open on it.

    Created on the asyncio side (grpclib binds the running loop); reconnects on use after a loss.
    """

    def __init__(self, host: str, port: int, config: Configuration = HTTP2_CONFIG) -> None:
        super().__init__(host, port, config=config)
        self.open_streams = 0
        #: The peer's SETTINGS_MAX_CONCURRENT_STREAMS; None until its first SETTINGS frame (or a wait
        #: for it) settled it. Kept across reconnects: the same engine most likely answers again.
        self.stream_limit: int | None = None
        self._settled = asyncio.Event()
        self._attempt: asyncio.Task | None = None

    def connect_attempt(self, timeout: float) -> asyncio.Task:
        """The connect in progress, else a new one, bounded by `timeout`.

        One attempt however many streams wait for it, in a task of its own: a stream that stops
        waiting (its client left) does not cancel it for the others. Waiting on grpclib's connect
        lock instead, each stream with its own timeout, lost wake-ups on Python 3.12 under load: a
        stream waited its whole timeout for a connection that another had opened meanwhile.
        """
        if self._attempt is None or self._attempt.done():
            self._attempt = asyncio.get_running_loop().create_task(asyncio.wait_for(self.__connect__(), timeout))
            self._attempt.add_done_callback(_retrieve)  # a failure nobody waits for any more is not an error
        return self._attempt

    def close(self) -> None:
        if self._attempt is not None and not self._attempt.done():
            self._attempt.cancel()  # it would open a connection nobody will close
        super().close()

    def flush(self) -> None:
        """Send what this connection buffered, now."""
        protocol = self._protocol
        if protocol is not None:
            protocol.writer.flush()  # type: ignore[attr-defined]

    def _protocol_factory(self) -> H2Protocol:
        return _ClientProtocol(ClientHandler(), self._config, self._h2_config, report=self._limit_reported)

    def _limit_reported(self, limit: int | None) -> None:
        if limit is not None:
            self.stream_limit = limit
        self._settled.set()

    async def learn_stream_limit(self, timeout: float) -> None:
        """Wait for the peer's first SETTINGS; a peer that sends none gets the default limit."""
        if self.stream_limit is None:
            try:
                await asyncio.wait_for(self._settled.wait(), timeout)
            except TimeoutError:
                pass
            if self.stream_limit is None:
                self.stream_limit = _DEFAULT_STREAM_LIMIT


class EngineChannel:
    """One engine's HTTP/2 connections, connected on first use and reconnected after a loss.

    Control calls (health, abort, load, info) have a connection of their own, so they never queue
    behind request work. Streams and unary work calls (`Embed`) fill a connection up to the limit its
    peer advertised (grpclib would queue the next one until a stream closes) and then open another.

    Must be used inside `open_asyncio_loop()`. `close()` it before that loop ends.
    """

    def __init__(
        self, host: str, port: int, *, connect_timeout: float = 5.0, config: Configuration | None = None
    ) -> None:
        self.host = host
        self.port = port
        self.connect_timeout = connect_timeout
        #: HTTP/2 settings of every connection (`client_config`: windows and keepalive pings).
        self.config = config if config is not None else client_config()
        self.name = f"{host}:{port}"
        self._control: _Connection | None = None
        self._streaming: list[_Connection] = []
        #: The open streams (their asyncio call and the channel their messages reach trio by), for
        #: `fail_streams`; and the unary calls in progress: `idle` when both are none.
        self._streams: dict[asyncio.Task, trio.MemorySendChannel] = {}
        self._unary_calls = 0
        self._idle: trio.Event | None = None
        #: Set by `retire`: the engine left the fleet, every call fails as unavailable.
        self.retired = False

    # --- trio side -------------------------------------------------------------------------------

    async def unary(self, path: str, request: Any, response_type: type, *, timeout: float | None) -> Any:
        """One unary control call; raises a typed `EngineError` on failure."""
        if self.retired:
            raise EngineUnavailable(_RETIRED, engine=self.name)
        self._unary_calls += 1
        try:
            return await aio(self._unary_aio)(path, request, response_type, timeout)
        finally:
            self._unary_calls -= 1
            self._note_idle()

    async def unary_work(self, path: str, request: Any, response_type: type, *, timeout: float | None) -> Any:
        """A unary call that is request work (`Embed`): it rides the connections for streams, so a
        batch of them never queues health checks and Aborts behind it. Cancelling it resets its
        HTTP/2 stream, which the engine observes as a client cancel."""
        if self.retired:
            raise EngineUnavailable(_RETIRED, engine=self.name)
        self._unary_calls += 1
        try:
            return await aio(self._unary_work_aio)(path, request, response_type, timeout)
        finally:
            self._unary_calls -= 1
            self._note_idle()

    @asynccontextmanager
    async def open_stream(
        self, path: str, request: Any, response_type: type, *, timeout: float | None
    ) -> AsyncIterator[MessageStream]:
        """A server-streaming call, open for the body of the ``async with``.

        Leaving the block before the stream ended (cancellation, an error, a ``break``) resets the
        HTTP/2 stream, which the engine observes as a client cancel.
        """
        send, receive = trio.open_memory_channel(math.inf)
        written = trio.Event()
        if self.retired:  # fails at the first read, like any call that cannot reach its engine
            send.send_nowait(_Failure(EngineUnavailable(_RETIRED, engine=self.name)))
            send.close()
            written.set()
            yield MessageStream(receive, written)
            return
        # The call's asyncio task is started directly rather than awaited from a trio task: no nursery,
        # pump task or wrapper future per stream, which is fewer scheduling hops before the request
        # leaves and fewer objects for the garbage collector to walk per open stream.
        call = current_loop().create_task(self._stream_aio(path, request, response_type, timeout, send, written))
        self._streams[call] = send
        try:
            yield MessageStream(receive, written, send)
        finally:
            try:
                if not call.done():
                    call.cancel()  # grpclib's stream exit, inside asyncio, resets the HTTP/2 stream
                    await settled(call, _CANCEL_SETTLE_TIMEOUT)
            finally:
                del self._streams[call]
                self._note_idle()

    async def connect_for_streams(self) -> None:
        """Have a connection for streams open, its stream limit learned, before a stream needs one.

        The first stream would otherwise wait for the TCP connect and the peer's first SETTINGS.
        Raises `EngineUnavailable` when the engine cannot be reached.
        """
        await aio(self._connect_for_streams_aio)()

    @property
    def stream_connections(self) -> int:
        """Connections for streams that are open now (the control connection aside)."""
        return sum(1 for connection in self._streaming if connection._connected)

    def close(self) -> None:
        """Drop every connection; in-flight calls fail as unavailable."""
        connections, self._streaming = self._streaming, []
        if self._control is not None:
            connections.append(self._control)
            self._control = None
        for connection in connections:
            connection.close()

    # --- draining (an engine leaving the fleet) --------------------------------------------------

    @property
    def streams_in_flight(self) -> int:
        """Streams open on this engine now (each one an engine request still being read)."""
        return len(self._streams)

    @property
    def idle(self) -> bool:
        """No stream open and no unary call (an `Abort` included) in progress."""
        return not self._streams and not self._unary_calls

    async def wait_idle(self) -> None:
        """Return once `idle` (at once if it is).

        Idleness is checked again on waking: a stream's reader that sends an `Abort` as it leaves
        starts that call before it yields, so a stream ending is never mistaken for the engine
        being done with.
        """
        while not self.idle:
            if self._idle is None:
                self._idle = trio.Event()
            await self._idle.wait()

    def fail_streams(self, error: EngineError) -> int:
        """End every open stream with `error`, now: each reader gets it after the messages that had
        arrived (its request then ends like any that lost its engine: retried before its first
        token, else an error for its client, and an `Abort`), and the HTTP/2 stream is reset.
        Returns how many streams it ended."""
        streams = list(self._streams.items())
        for call, send in streams:
            try:
                send.send_nowait(_Failure(error))
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                pass  # the call already ended; its reader sees how
            call.cancel()
        return len(streams)

    def retire(self) -> None:
        """Close every connection for good: the engine left the fleet. Later calls fail at once as
        unavailable instead of connecting again (a request routed just before it left is then
        retried elsewhere, before its first token)."""
        self.retired = True
        self.close()

    def _note_idle(self) -> None:
        if self._idle is not None and self.idle:
            self._idle.set()
            self._idle = None

    # --- asyncio side ----------------------------------------------------------------------------

    async def _connected(self, connection: _Connection) -> _Connection:
        if connection._connected:  # the hot path: no task for an open connection
            return connection
        attempt = connection.connect_attempt(self.connect_timeout)
        await asyncio.wait((attempt,))  # leaving early (cancelled) leaves the attempt running
        if attempt.cancelled():  # the connection was closed meanwhile
            raise EngineUnavailable("connection closed while connecting", engine=self.name)
        try:
            attempt.result()
        except TimeoutError:
            raise EngineUnavailable(f"connect timed out after {self.connect_timeout:g}s", engine=self.name) from None
        except OSError as error:
            raise EngineUnavailable(f"cannot connect: {error.strerror or error}", engine=self.name) from None
        return connection

    async def _stream_connection(self) -> _Connection:
        """The least loaded connection with room for one more stream, that slot reserved; opens one
        when all are full.

        Least loaded rather than first with room: every connection keeps getting new streams, and h2
        forgets a connection's closed streams only when it opens a new one (otherwise thousands of
        finished streams' state linger on connections that stopped getting new ones).

        An extra connection that cannot be opened (an engine too busy to accept in time) is dropped
        and the stream queues on the least loaded open connection instead: only an engine that no
        connection reaches fails the request.
        """
        while True:
            best: _Connection | None = None
            for connection in self._streaming:
                limit = connection.stream_limit
                if limit is None:  # new: its peer's first SETTINGS tell how many streams fit
                    try:
                        await self._connected(connection)
                    except EngineUnavailable:
                        if connection in self._streaming:
                            self._streaming.remove(connection)
                            connection.close()
                        fallback = self._least_loaded()
                        if fallback is None:
                            raise
                        fallback.open_streams += 1
                        return fallback
                    await connection.learn_stream_limit(self.connect_timeout)
                    break  # rescan: the list may have changed meanwhile
                if connection.open_streams < limit and (best is None or connection.open_streams < best.open_streams):
                    best = connection
            else:
                if best is not None:
                    best.open_streams += 1
                    return best
                if len(self._streaming) < _MAX_STREAM_CONNECTIONS:
                    self._streaming.append(_Connection(self.host, self.port, self.config))
                    continue
                # A peer advertising 0 (or tiny) limits must not make us open connections forever:
                # past the cap, grpclib queues the stream on the least loaded connection.
                connection = min(self._streaming, key=lambda c: c.open_streams)
                connection.open_streams += 1
                return connection

    async def _connect_for_streams_aio(self) -> None:
        connection = await self._stream_connection()
        connection.open_streams -= 1  # the slot it reserved: no stream takes it

    def _least_loaded(self) -> _Connection | None:
        """The open connection with the fewest streams (grpclib queues past its limit), if any."""
        open_ = [c for c in self._streaming if c._connected and c.stream_limit is not None]
        return min(open_, key=lambda c: c.open_streams) if open_ else None

    async def _unary_aio(self, path, request, response_type, timeout):
        if self._control is None:
            self._control = _Connection(self.host, self.port, self.config)
        channel = await self._connected(self._control)
        try:
            async with channel.request(
                path, Cardinality.UNARY_UNARY, type(request), response_type, timeout=timeout
            ) as stream:
                await stream.send_message(request, end=True)
                return await stream.recv_message()
        except Exception as error:  # noqa: BLE001 - everything becomes a typed engine error
            raise self._typed(error) from None

    async def _unary_work_aio(self, path, request, response_type, timeout):
        try:
            connection = await self._stream_connection()
            try:
                channel = await self._connected(connection)
                async with channel.request(
                    path, Cardinality.UNARY_UNARY, type(request), response_type, timeout=timeout
                ) as stream:
                    await stream.send_message(request, end=True)
                    channel.flush()  # the request goes now, not a scheduling round later
                    return await stream.recv_message()
            finally:
                connection.open_streams -= 1
        except Exception as error:  # noqa: BLE001 - everything becomes a typed engine error
            raise self._typed(error) from None

    async def _stream_aio(self, path, request, response_type, timeout, send, written: trio.Event) -> None:
        """The whole call, in asyncio: messages and then a failure or the end go to ``send``;
        ``written`` is set once the request is on the wire, or the call ended before that."""
        with send:
            try:
                connection = await self._stream_connection()
                try:
                    channel = await self._connected(connection)
                    async with channel.request(
                        path, Cardinality.UNARY_STREAM, type(request), response_type, timeout=timeout
                    ) as stream:
                        await stream.send_message(request, end=True)
                        channel.flush()  # the request goes now, not a scheduling round later
                        written.set()
                        push, buffered = send.send_nowait, send.statistics
                        while (message := await stream.recv_message()) is not None:
                            push(message)
                            # A reader that stops taking messages (its client stopped reading) stops
                            # this call's reads, so the engine's stream is held back by HTTP/2 flow
                            # control instead of piling up here (failures and wake-ups still pass).
                            # Polled, only while full: an event would cost every message a signal
                            # from the trio side.
                            while buffered().current_buffer_used >= STREAM_BUFFER:  # noqa: ASYNC110
                                await asyncio.sleep(_BUFFER_POLL)
                finally:
                    connection.open_streams -= 1
            except Exception as error:  # noqa: BLE001 - everything becomes a typed engine error
                send.send_nowait(_Failure(self._typed(error)))
            except asyncio.CancelledError:
                # The trio side left (grpclib's exit above reset the stream). Ending normally rather
                # than cancelled matters on Python 3.12+: a cancelled task keeps its CancelledError,
                # whose traceback's frames link back (f_back) through trio-asyncio's loop frame to
                # the handle that woke this task: a reference cycle holding the request until a full
                # garbage collection.
                pass
            finally:
                written.set()  # nobody waits for a request that will never be written

    def _typed(self, error: Exception) -> EngineError:
        if isinstance(error, EngineError):
            return error
        if isinstance(error, GRPCError):
            return error_for_status(error.status.name, error.message or "", engine=self.name)
        if isinstance(error, asyncio.TimeoutError):
            return EngineDeadlineExceeded("deadline exceeded", engine=self.name)
        if isinstance(error, (StreamTerminatedError, ProtocolError, ConnectionError, OSError)):
            return EngineUnavailable(f"connection lost: {error}", engine=self.name)
        return error_for_status("INTERNAL", f"{type(error).__name__}: {error}", engine=self.name)


class ChannelPool:
    """Engine channels by address: created lazily, shared by every caller, closed together."""

    def __init__(self, *, connect_timeout: float = 5.0, config: Configuration | None = None) -> None:
        self.connect_timeout = connect_timeout
        self.config = config if config is not None else client_config()
        self._channels: dict[tuple[str, int], EngineChannel] = {}

    def get(self, host: str, port: int) -> EngineChannel:
        key = (host, port)
        channel = self._channels.get(key)
        if channel is None:
            channel = self._channels[key] = EngineChannel(
                host, port, connect_timeout=self.connect_timeout, config=self.config
            )
        return channel

    def retire(self, host: str, port: int) -> None:
        """The engine at ``host:port`` left the fleet: retire its channel and forget it (an engine
        that joins there later gets a new one)."""
        channel = self._channels.pop((host, port), None)
        if channel is not None:
            channel.retire()

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()
