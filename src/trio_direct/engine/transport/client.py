"""An engine's HTTP/2 connections and the calls trio code makes on them, in trio alone.

The protocol is `wire.GrpcConnection` (sans-IO); this module is its I/O shell. Each connection is
one non-blocking socket and one task in the transport's nursery (`open_transport`): it connects,
then reads, cuts frames and puts each stream's messages on that stream, waking the task that
waits for it. A consumer finding messages already there takes them without a task switch, and its
taking them is what opens the stream's flow-control window again: a consumer that stops reading
stops its engine stream after one window (256 KiB), never buffering more.

Writes go straight to the socket from whichever task produced them (a request's HEADERS and DATA
in one send); only what the kernel does not accept at once waits for the connection's task.

Each engine gets several connections: one for control (unary) calls, so a health check or an
`Abort` never waits behind generations, and as many for request work (generation streams, `Embed`
calls) as the peer's SETTINGS_MAX_CONCURRENT_STREAMS needs, up to 32; past that a new stream
waits for a slot on the least loaded one.
"""

from __future__ import annotations

import contextvars
import errno
import os
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import trio

from trio_direct.engine.errors import (
    EngineDeadlineExceeded,
    EngineError,
    EngineUnavailable,
    StreamWakeup,
    error_for_status,
)
from trio_direct.engine.transport.wire import (
    ConnectionTerminated,
    GoAwayReceived,
    GrpcConnection,
    GrpcStream,
    PingAcknowledged,
    SettingsReceived,
)

__all__ = [
    "HTTP2_CONFIG",
    "ChannelPool",
    "ClientConfig",
    "EngineChannel",
    "MessageStream",
    "client_config",
    "open_transport",
]


@dataclass(frozen=True, slots=True)
class ClientConfig:
    """HTTP/2 settings of the connections to engines.

    `stream_window` is also the most one stream buffers while its consumer does not read (the
    engine then waits); `connection_window` is shared by a connection's streams.
    `keepalive_interval`: seconds between PINGs while calls are open (0: none); one unanswered
    for `keepalive_timeout` seconds closes the connection, failing its calls as unavailable.
    """

    stream_window: int = 256 * 1024
    connection_window: int = 16 * 1024 * 1024
    keepalive_interval: float = 0.0
    keepalive_timeout: float = 20.0


#: Windows large enough that prompts of many thousand token ids and fast token streams never wait
#: on flow-control updates; no keepalive pings.
HTTP2_CONFIG = ClientConfig()

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
) -> ClientConfig:
    """`HTTP2_CONFIG`'s windows, and a ping every `keepalive_interval` seconds while calls are open
    (0: none); one unanswered for `keepalive_timeout` seconds closes the connection. Pings keep
    going on a connection that only receives (a long generation sends nothing upstream), so a dead
    engine is noticed there too."""
    if keepalive_interval <= 0:
        return HTTP2_CONFIG
    return ClientConfig(
        stream_window=HTTP2_CONFIG.stream_window,
        connection_window=HTTP2_CONFIG.connection_window,
        keepalive_interval=keepalive_interval,
        keepalive_timeout=keepalive_timeout,
    )


# --- the transport's nursery --------------------------------------------------------------------

_nursery: contextvars.ContextVar[trio.Nursery | None] = contextvars.ContextVar("trio_direct_transport", default=None)
#: The nursery opened by `open_transport`, for tasks that do not inherit its contextvar: hypercorn's
#: own CLI starts request tasks outside the context where an app opened it.
_process_nursery: trio.Nursery | None = None


@asynccontextmanager
async def open_transport() -> AsyncIterator[trio.Nursery]:
    """The nursery every engine connection's task runs in; open it around the whole program.

    Reentrant: inside an open one this yields that one. Leaving it ends every connection (close
    channels first for their calls to fail cleanly).
    """
    global _process_nursery
    current = _nursery.get()
    if current is not None:
        yield current
        return
    async with trio.open_nursery() as nursery:
        token = _nursery.set(nursery)
        outer, _process_nursery = _process_nursery, nursery
        try:
            yield nursery
        finally:
            _process_nursery = outer
            _nursery.reset(token)
            nursery.cancel_scope.cancel()


def _transport_nursery() -> trio.Nursery:
    nursery = _nursery.get() or _process_nursery
    if nursery is None:
        raise RuntimeError("engine calls need the transport: run them inside `open_transport()`")
    return nursery


#: How much one read takes from the socket at most.
_RECEIVE_SIZE = 256 * 1024

#: Why a call to an engine that left the fleet fails.
_RETIRED = "engine removed from the fleet"

#: Stream connections per engine at most (3,200 streams at a limit of 100, more than an engine runs).
_MAX_STREAM_CONNECTIONS = 32

#: The stream limit assumed for a peer whose SETTINGS never came; h2 and grpclib servers advertise 100.
_DEFAULT_STREAM_LIMIT = 100


class _Connection:
    """One HTTP/2 connection to an engine: a socket, its `GrpcConnection`, and its task.

    Opened once (`start`); a connection that failed or was closed stays closed, and the channel
    opens a new one in its place.
    """

    def __init__(self, host: str, port: int, config: ClientConfig, name: str) -> None:
        self.host = host
        self.port = port
        self.config = config
        self.name = name
        #: Stream slots taken on this connection (streams open, and ones about to open).
        self.open_streams = 0
        #: The peer's SETTINGS_MAX_CONCURRENT_STREAMS; None until its first SETTINGS settled it.
        self.stream_limit: int | None = None
        self.wire = GrpcConnection(f"{host}:{port}", stream_window=config.stream_window,
                                   connection_window=config.connection_window)  # fmt: skip
        self.connected = False
        self.closed = False
        #: Why it failed to connect or ended (None while fine).
        self.error: EngineError | None = None
        self._ready = trio.Event()  # connected (or failed to)
        self._settled = trio.Event()  # the peer's first SETTINGS arrived (or never will)
        self._slot_freed = trio.lowlevel.ParkingLot()
        self._sock: socket.socket | None = None
        self._pending = b""  # what the socket did not take yet
        self._writable: trio.Event | None = None
        self._ping_acked = trio.Event()
        self._scope: trio.CancelScope | None = None
        self._started = False

    # --- lifecycle ------------------------------------------------------------------------------

    def start(self, timeout: float) -> None:
        """Connect in the transport's nursery (once): however many calls wait for it, and whoever
        of them leaves, the attempt goes on for the others."""
        if not self._started:
            self._started = True
            try:
                _transport_nursery().start_soon(self._run, timeout, name=f"engine connection {self.name}")
            except RuntimeError as error:  # no transport, or it is shutting down
                self._fail(EngineUnavailable(f"cannot connect: {error}", engine=self.name))

    async def wait_connected(self, timeout: float) -> None:
        """Connect if not yet; raises `EngineUnavailable` when the engine cannot be reached."""
        self.start(timeout)
        if not self._ready.is_set():
            await self._ready.wait()
        if self.error is not None:
            raise self.error
        if self.closed:
            raise EngineUnavailable("connection closed", engine=self.name)

    async def learn_stream_limit(self, timeout: float) -> None:
        """Wait for the peer's first SETTINGS; a peer that sends none gets the default limit."""
        if self.stream_limit is None:
            with trio.move_on_after(timeout):
                await self._settled.wait()
            if self.stream_limit is None:
                self.stream_limit = _DEFAULT_STREAM_LIMIT

    @property
    def usable(self) -> bool:
        """Open (or opening) and taking new streams."""
        return not self.closed and not self.wire.closing

    async def _open_socket(self, timeout: float) -> socket.socket:
        """A connected non-blocking socket to the engine, within `timeout` seconds."""
        with trio.move_on_after(timeout) as scope:
            infos = await trio.socket.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)
            last: OSError | None = None
            for family, kind, proto, _, address in infos:
                sock = socket.socket(family, kind, proto)
                sock.setblocking(False)
                try:
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    code = sock.connect_ex(address)
                    if code not in (0, errno.EINPROGRESS, errno.EAGAIN):
                        raise OSError(code, os.strerror(code))
                    if code:
                        await trio.lowlevel.wait_writable(sock)
                        code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                        if code:
                            raise OSError(code, os.strerror(code))
                    return sock
                except OSError as error:
                    last = error
                    sock.close()
                except BaseException:
                    sock.close()
                    raise
            raise last if last is not None else OSError("no address")
        assert scope.cancelled_caught
        raise TimeoutError

    async def _run(self, timeout: float) -> None:
        with trio.CancelScope() as scope:
            self._scope = scope
            try:
                try:
                    sock = await self._open_socket(timeout)
                except TimeoutError:
                    self._fail(EngineUnavailable(f"connect timed out after {timeout:g}s", engine=self.name))
                    return
                except OSError as error:
                    reason = error.strerror or str(error)
                    self._fail(EngineUnavailable(f"cannot connect: {reason}", engine=self.name))
                    return
                if self.closed:  # closed while connecting
                    sock.close()
                    return
                self._sock = sock
                self.connected = True
                self.wire.initiate()
                self._flush()
                self._ready.set()
                if self.config.keepalive_interval > 0:
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(self._keepalive)
                        await self._read()
                        nursery.cancel_scope.cancel()
                else:
                    await self._read()
            finally:
                self._shut("connection closed")

    def _fail(self, error: EngineError) -> None:
        self.error = error
        self._shut(error.message)

    def close(self) -> None:
        """Drop the connection; its calls fail as unavailable."""
        self._shut("connection closed")

    def _shut(self, reason: str) -> None:
        if self.closed:
            return
        self.closed = True
        self.connected = False
        self.wire.connection_lost(reason)
        self._deliver()
        self._ready.set()
        self._settled.set()
        self._slot_freed.unpark_all()
        if self._writable is not None:
            self._writable.set()
        sock, self._sock = self._sock, None
        if sock is not None:
            trio.lowlevel.notify_closing(sock)
            sock.close()
        if self._scope is not None:
            self._scope.cancel()

    # --- reading --------------------------------------------------------------------------------

    async def _read(self) -> None:
        sock = self._sock
        assert sock is not None
        wire = self.wire
        receive = wire.receive_data
        while True:
            try:
                await trio.lowlevel.wait_readable(sock)
                data = sock.recv(_RECEIVE_SIZE)
            except BlockingIOError:
                continue
            except (OSError, trio.ClosedResourceError) as error:
                self._shut(f"connection lost: {error}")
                return
            if not data:
                self._shut("connection closed by the engine")
                return
            events = receive(data)
            if events:
                self._on_events(events)
            if wire.touched:
                self._deliver()
            self._flush()
            if wire.terminated is not None or (wire.closing and not wire.streams):
                self._shut(wire.terminated.reason if wire.terminated is not None else "engine going away")
                return

    def _on_events(self, events: list[Any]) -> None:
        for event in events:
            if type(event) is SettingsReceived:
                self.stream_limit = event.max_concurrent_streams
                if self.stream_limit is None:
                    self.stream_limit = 2**31
                self._settled.set()
                self._slot_freed.unpark_all()
            elif type(event) is PingAcknowledged:
                self._ping_acked.set()
            elif type(event) is GoAwayReceived:
                self._slot_freed.unpark_all()  # waiters go elsewhere
            elif type(event) is ConnectionTerminated:
                pass  # handled by the read loop

    def _deliver(self) -> None:
        """Wake the task waiting on each stream that has news."""
        touched = self.wire.touched
        for stream in touched:
            task = stream.waiter
            if task is not None:
                stream.waiter = None
                trio.lowlevel.reschedule(task)
        touched.clear()

    # --- writing --------------------------------------------------------------------------------

    def _flush(self) -> None:
        """Send what the protocol queued, now; what the socket does not take waits for `_drain`."""
        data = self.wire.data_to_send()
        if not data:
            return
        if self._pending:
            self._pending += data
            return
        sock = self._sock
        if sock is None:
            return
        try:
            sent = sock.send(data)
        except BlockingIOError:
            sent = 0
        except OSError as error:
            self._shut(f"connection lost: {error}")
            return
        if sent < len(data):
            self._pending = data[sent:]
            try:
                _transport_nursery().start_soon(self._drain)
            except RuntimeError:  # the transport is shutting down: so is this connection
                self._shut("transport closed")

    async def _drain(self) -> None:
        while self._pending and self._sock is not None:
            sock = self._sock
            try:
                await trio.lowlevel.wait_writable(sock)
                sent = sock.send(self._pending)
            except BlockingIOError:
                continue
            except (OSError, trio.ClosedResourceError) as error:
                self._shut(f"connection lost: {error}")
                return
            self._pending = self._pending[sent:]

    async def _keepalive(self) -> None:
        interval = self.config.keepalive_interval
        while True:
            await trio.sleep(interval)
            if not self.wire.streams:
                continue  # an idle connection is not pinged
            self._ping_acked = trio.Event()
            self.wire.ping(b"tdkalive")
            self._flush()
            with trio.move_on_after(self.config.keepalive_timeout):
                await self._ping_acked.wait()
                continue
            self._shut(f"keepalive ping unanswered for {self.config.keepalive_timeout:g}s")
            return

    # --- calls ----------------------------------------------------------------------------------

    def start_call(self, path: str, request: Any, timeout: float | None) -> GrpcStream:
        stream = self.wire.start_call(path, request.SerializeToString(), timeout)
        self._flush()
        return stream

    def end_call(self, stream: GrpcStream) -> None:
        """The call is over for its caller: reset its stream if the engine has not ended it, and
        free its slot."""
        self.wire.reset(stream)
        self._flush()
        if self.wire.closing and not self.wire.streams and not self.closed:
            self._shut("engine going away")
        self._slot_freed.unpark(count=1)

    async def wait_for_slot(self) -> None:
        await self._slot_freed.park()


async def _wait(stream: GrpcStream) -> None:
    """Park until the connection's task puts news on `stream` (cancellable)."""
    stream.waiter = trio.lowlevel.current_task()

    def abort(_: Any) -> trio.lowlevel.Abort:
        stream.waiter = None
        return trio.lowlevel.Abort.SUCCEEDED

    await trio.lowlevel.wait_task_rescheduled(abort)


class MessageStream:
    """Messages of one server-streaming call, read from trio.

    Iterating yields protobuf messages; the call's failure is raised by the iteration at the point
    the stream broke, after every message that arrived before it.

    `written` is set once the request is on the wire (or the call failed before that).
    """

    __slots__ = ("_connection", "_stream", "_parse", "_engine", "_failure", "_wakeup", "written")

    def __init__(
        self,
        connection: _Connection | None,
        stream: GrpcStream,
        response_type: type,
        engine: str,
        failure: EngineError | None = None,
    ) -> None:
        self._connection = connection
        self._stream = stream
        self._parse = response_type.FromString  # type: ignore[attr-defined]
        self._engine = engine
        #: An error put on the stream by this side (`fail`), raised after what already arrived.
        self._failure = failure
        self._wakeup = False
        self.written = trio.Event()
        self.written.set()

    def __aiter__(self) -> MessageStream:
        return self

    async def __anext__(self) -> Any:
        await trio.lowlevel.checkpoint_if_cancelled()
        stream = self._stream
        if stream.messages:  # arrived meanwhile: still a schedule point, as every trio call is
            message = self._take()
            await trio.lowlevel.cancel_shielded_checkpoint()
            return message
        while True:
            if self._wakeup:
                self._wakeup = False
                raise StreamWakeup
            self._raise_outcome()
            await _wait(stream)  # a schedule point and a cancel point: no second one after it
            if stream.messages:
                return self._take()

    def _take(self) -> Any:
        connection = self._connection
        assert connection is not None
        data = connection.wire.take(self._stream)
        if connection.wire._out:  # a window update: it goes now
            connection._flush()
        try:
            return self._parse(data)
        except Exception as error:  # noqa: BLE001 - a message that does not parse is the engine's fault
            raise error_for_status(
                "INTERNAL", f"cannot parse the engine's reply: {error}", engine=self._engine
            ) from None

    def _raise_outcome(self) -> None:
        """Raise how the call ended, if it did: StopAsyncIteration, or its error."""
        if self._failure is not None:
            raise self._failure
        outcome = self._stream.outcome
        if outcome is not None:
            status, message = outcome
            if status == "OK":
                raise StopAsyncIteration
            raise error_for_status(status, message, engine=self._engine)

    def receive_nowait(self) -> Any:
        """Next already-arrived message, for coalescing; raises trio.WouldBlock when none, and
        trio.EndOfChannel when the call ended well."""
        stream = self._stream
        if stream.messages:  # `_take`, inline: this runs for most messages of a busy stream
            connection = self._connection
            assert connection is not None
            wire = connection.wire
            data = wire.take(stream)
            if wire._out:  # a window update: it goes now
                connection._flush()
            try:
                return self._parse(data)
            except Exception as error:  # noqa: BLE001 - a message that does not parse is the engine's fault
                raise error_for_status(
                    "INTERNAL", f"cannot parse the engine's reply: {error}", engine=self._engine
                ) from None
        self._wakeup = False  # a wake-up is moot while messages are being read
        try:
            self._raise_outcome()
        except StopAsyncIteration:
            raise trio.EndOfChannel from None
        raise trio.WouldBlock

    def fail(self, error: EngineError) -> bool:
        """End the stream with `error` for its reader, after what already arrived (a hung engine);
        False when the call already ended."""
        if self._failure is not None or self._stream.outcome is not None:
            return False
        self._failure = error
        self._notify()
        return True

    def wake(self) -> bool:
        """Have a reader waiting for the next message raise `StreamWakeup` (it reads on after);
        False when the call already ended."""
        if self._failure is not None or self._stream.outcome is not None:
            return False
        self._wakeup = True
        self._notify()
        return True

    def _notify(self) -> None:
        task = self._stream.waiter
        if task is not None:
            self._stream.waiter = None
            trio.lowlevel.reschedule(task)


class EngineChannel:
    """One engine's HTTP/2 connections, connected on first use and reconnected after a loss.

    Control calls (health, abort, load, info) have a connection of their own, so they never queue
    behind request work. Streams and unary work calls (`Embed`) fill a connection up to the limit its
    peer advertised and then open another.

    Must be used inside `open_transport()`.
    """

    def __init__(
        self, host: str, port: int, *, connect_timeout: float = 5.0, config: ClientConfig | None = None
    ) -> None:
        self.host = host
        self.port = port
        self.connect_timeout = connect_timeout
        #: HTTP/2 settings of every connection (`client_config`: windows and keepalive pings).
        self.config = config if config is not None else client_config()
        self.name = f"{host}:{port}"
        self._control: _Connection | None = None
        self._streaming: list[_Connection] = []
        #: The open streams, for `fail_streams`; and the unary calls in progress: `idle` when both
        #: are none.
        self._streams: dict[MessageStream, _Connection] = {}
        self._unary_calls = 0
        self._idle: trio.Event | None = None
        #: Set by `retire`: the engine left the fleet, every call fails as unavailable.
        self.retired = False

    def _new_connection(self) -> _Connection:
        return _Connection(self.host, self.port, self.config, self.name)

    # --- calls ----------------------------------------------------------------------------------

    async def unary(self, path: str, request: Any, response_type: type, *, timeout: float | None) -> Any:
        """One unary control call; raises a typed `EngineError` on failure."""
        if self.retired:
            raise EngineUnavailable(_RETIRED, engine=self.name)
        self._unary_calls += 1
        try:
            if self._control is None or not self._control.usable:
                self._control = self._new_connection()
            connection = self._control
            with trio.move_on_after(timeout if timeout is not None else float("inf")) as scope:
                await connection.wait_connected(self.connect_timeout)
                return await self._unary_on(connection, path, request, response_type, timeout)
            assert scope.cancelled_caught
            raise EngineDeadlineExceeded("deadline exceeded", engine=self.name)
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
            with trio.move_on_after(timeout if timeout is not None else float("inf")) as scope:
                connection = await self._stream_connection()
                try:
                    return await self._unary_on(connection, path, request, response_type, timeout)
                finally:
                    connection.open_streams -= 1
            assert scope.cancelled_caught
            raise EngineDeadlineExceeded("deadline exceeded", engine=self.name)
        finally:
            self._unary_calls -= 1
            self._note_idle()

    async def _unary_on(
        self, connection: _Connection, path: str, request: Any, response_type: type, timeout: float | None
    ) -> Any:
        try:
            stream = connection.start_call(path, request, timeout)
        except RuntimeError:
            raise EngineUnavailable("connection closing", engine=self.name) from None
        reader = MessageStream(connection, stream, response_type, self.name)
        try:
            while stream.outcome is None:
                await _wait(stream)
            reply = None
            while stream.messages:
                reply = reader._take()
            status, message = stream.outcome
            if status != "OK":
                raise error_for_status(status, message, engine=self.name)
            if reply is None:
                raise error_for_status("INTERNAL", "no reply message", engine=self.name)
            return reply
        finally:
            connection.end_call(stream)

    @asynccontextmanager
    async def open_stream(
        self, path: str, request: Any, response_type: type, *, timeout: float | None
    ) -> AsyncIterator[MessageStream]:
        """A server-streaming call, open for the body of the ``async with``.

        A call that cannot start (the engine is unreachable) fails at the first read. Leaving the
        block before the stream ended (cancellation, an error, a ``break``) resets the HTTP/2
        stream, which the engine observes as a client cancel.
        """
        failure: EngineError | None = None
        connection: _Connection | None = None
        if self.retired:
            failure = EngineUnavailable(_RETIRED, engine=self.name)
        else:
            try:
                connection = await self._stream_connection()
            except EngineError as error:
                failure = error
        if connection is None:
            yield MessageStream(None, _ENDED, response_type, self.name, failure)
            return
        try:
            stream = connection.start_call(path, request, timeout)
        except RuntimeError:
            connection.open_streams -= 1
            connection._slot_freed.unpark(count=1)
            yield MessageStream(
                None, _ENDED, response_type, self.name, EngineUnavailable("connection closing", engine=self.name)
            )
            return
        reader = MessageStream(connection, stream, response_type, self.name)
        self._streams[reader] = connection
        try:
            yield reader  # a `timeout` travels as grpc-timeout: the engine ends the call DEADLINE_EXCEEDED
        finally:
            del self._streams[reader]
            connection.open_streams -= 1
            connection.end_call(stream)
            self._note_idle()

    async def connect_for_streams(self) -> None:
        """Have a connection for streams open, its stream limit learned, before a stream needs one.

        Raises `EngineUnavailable` when the engine cannot be reached.
        """
        if self.retired:
            raise EngineUnavailable(_RETIRED, engine=self.name)
        connection = await self._stream_connection()
        connection.open_streams -= 1  # the slot it reserved: no stream takes it
        connection._slot_freed.unpark(count=1)

    async def _stream_connection(self) -> _Connection:
        """The least loaded connection with room for one more stream, that slot reserved; opens one
        when all are full.

        Least loaded rather than first with room: streams spread over the connections. An extra
        connection that cannot be opened (an engine too busy to accept in time) is dropped and the
        stream queues on the least loaded open connection instead: only an engine that no
        connection reaches fails the request.
        """
        while True:
            self._streaming = [c for c in self._streaming if c.usable]
            best: _Connection | None = None
            for connection in self._streaming:
                limit = connection.stream_limit
                if limit is None:  # new: its peer's first SETTINGS tell how many streams fit
                    try:
                        await connection.wait_connected(self.connect_timeout)
                    except EngineUnavailable:
                        if connection in self._streaming:
                            self._streaming.remove(connection)
                        fallback = self._least_loaded()
                        if fallback is None:
                            raise
                        return await self._queue_on(fallback)
                    await connection.learn_stream_limit(self.connect_timeout)
                    break  # rescan: the list may have changed meanwhile
                if connection.open_streams < limit and (best is None or connection.open_streams < best.open_streams):
                    best = connection
            else:
                if best is not None:
                    best.open_streams += 1
                    return best
                if len(self._streaming) < _MAX_STREAM_CONNECTIONS:
                    self._streaming.append(self._new_connection())
                    continue
                # A peer advertising 0 (or tiny) limits must not make us open connections forever:
                # past the cap, the stream waits for a slot on the least loaded connection.
                return await self._queue_on(min(self._streaming, key=lambda c: c.open_streams))

    async def _queue_on(self, connection: _Connection) -> _Connection:
        """Wait for a free slot on `connection` (or for it to close: then find another)."""
        connection.open_streams += 1
        try:
            while connection.usable and len(connection.wire.streams) >= (connection.stream_limit or 1):
                await connection.wait_for_slot()
        except BaseException:
            connection.open_streams -= 1
            raise
        if not connection.usable:
            connection.open_streams -= 1
            return await self._stream_connection()
        return connection

    def _least_loaded(self) -> _Connection | None:
        open_ = [c for c in self._streaming if c.connected and c.usable and c.stream_limit is not None]
        return min(open_, key=lambda c: c.open_streams) if open_ else None

    @property
    def stream_connections(self) -> int:
        """Connections for streams that are open now (the control connection aside)."""
        return sum(1 for connection in self._streaming if connection.connected)

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
        for reader, connection in streams:
            reader.fail(error)
            connection.wire.reset(reader._stream)
            connection._flush()
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


#: The stream of a call that never started (its reader raises the call's failure).
_ENDED = GrpcStream(0, 0)
_ENDED.outcome = ("OK", "")


class ChannelPool:
    """Engine channels by address: created lazily, shared by every caller, closed together."""

    def __init__(self, *, connect_timeout: float = 5.0, config: ClientConfig | None = None) -> None:
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
