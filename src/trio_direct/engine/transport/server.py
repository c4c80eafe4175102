"""gRPC serving with plain synchronous handlers, for the mock engine and tests (the frontend never
imports this module).

A handler gets a `ServerCall`, pushes replies with `send()` and ends with `finish()`/`fail()`; the
asyncio side drains them. One asyncio task per call, no per-message crossing.
"""

from __future__ import annotations

import asyncio
import collections
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import trio
from grpclib.config import Configuration
from grpclib.const import Cardinality, Handler, Status
from grpclib.exceptions import GRPCError
from grpclib.server import Server

from trio_direct.engine.transport.loop import aio, open_asyncio_loop

__all__ = ["RpcMethod", "ServerCall", "serve_grpc"]

#: Larger HTTP/2 windows than grpclib's defaults: prompts of many thousand token ids never wait on
#: flow-control updates.
SERVER_HTTP2_CONFIG = Configuration(
    http2_connection_window_size=16 * 1024 * 1024,
    http2_stream_window_size=4 * 1024 * 1024,
)


@dataclass(frozen=True, slots=True)
class RpcMethod:
    """One served RPC: its path, whether it streams replies, message types and a sync handler."""

    path: str
    streaming: bool
    request_type: type
    response_type: type
    handler: Callable[[ServerCall], None]


class ServerCall:
    """One incoming RPC seen by a synchronous handler.

    The handler (or code it hands the call to) calls `send()` for each reply and `finish()` or
    `fail()` once. If the client cancels first, `on_cancel` is called (synchronously) instead.
    """

    __slots__ = ("request", "peer", "on_cancel", "_replies", "_status", "_waiter", "_done")

    def __init__(self, request: Any, peer: str) -> None:
        self.request = request
        self.peer = peer
        self.on_cancel: Callable[[], None] | None = None
        self._replies: collections.deque = collections.deque()
        self._status: tuple[str, str] | None = None
        self._waiter: asyncio.Future | None = None
        self._done = False

    @property
    def done(self) -> bool:
        """True once finished, failed or cancelled: later sends are dropped."""
        return self._done

    def send(self, message: Any) -> None:
        if not self._done:
            self._replies.append(message)
            self._wake()

    def unsent_tail(self) -> Any | None:
        """The last reply not yet written to the wire (a sender may still amend it), else None."""
        return self._replies[-1] if self._replies else None

    def finish(self) -> None:
        self.fail("OK", "")

    def fail(self, status: str, message: str) -> None:
        """End the call with a gRPC status name (``"CANCELLED"``, ``"INTERNAL"``, ...)."""
        if not self._done:
            self._done = True
            self._status = (status, message)
            self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class _Service:
    """Adapts `RpcMethod`s to grpclib's ``__mapping__`` protocol."""

    def __init__(self, methods: Iterable[RpcMethod]) -> None:
        self._methods = list(methods)

    def __mapping__(self) -> dict[str, Handler]:
        return {
            m.path: Handler(
                _asyncio_handler(m),
                Cardinality.UNARY_STREAM if m.streaming else Cardinality.UNARY_UNARY,
                m.request_type,
                m.response_type,
            )
            for m in self._methods
        }


def _asyncio_handler(method: RpcMethod):
    async def handle(stream) -> None:
        request = await stream.recv_message()
        peer = stream.peer.addr() if stream.peer is not None else None
        call = ServerCall(request, f"{peer[0]}:{peer[1]}" if peer else "")
        loop = asyncio.get_running_loop()
        try:
            method.handler(call)
            while True:
                while call._replies:
                    await stream.send_message(call._replies.popleft())
                if call._status is not None:
                    break
                call._waiter = loop.create_future()
                await call._waiter
                call._waiter = None
        finally:
            if call._status is None:
                call._done = True
                if call.on_cancel is not None:
                    call.on_cancel()
        status, message = call._status
        if status != "OK":
            raise GRPCError(Status[status], message)

    return handle


class _Server(Server):
    """grpclib's server that also drops accepted connections on close.

    asyncio before Python 3.13 cannot close a server's client connections, so a stopped server would
    otherwise keep them (and their sockets) open until the peer hangs up.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._protocols: weakref.WeakSet = weakref.WeakSet()

    def _protocol_factory(self):
        protocol = super()._protocol_factory()
        self._protocols.add(protocol)
        return protocol

    def close(self) -> None:
        super().close()
        for protocol in list(self._protocols):
            processor = getattr(protocol, "processor", None)  # absent until the connection is made
            if processor is not None:
                processor.close("server closed")


async def serve_grpc(
    methods: Iterable[RpcMethod],
    host: str,
    port: int,
    *,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve `methods` on host:port until cancelled; reports the bound port (port 0 = ephemeral).

    Runs on the trio-asyncio loop of its caller, else on one of its own."""
    async with open_asyncio_loop():
        await _serve(methods, host, port, task_status)


async def _serve(methods: Iterable[RpcMethod], host: str, port: int, task_status: trio.TaskStatus[int]) -> None:
    server = _Server([_Service(methods)], config=SERVER_HTTP2_CONFIG)
    await aio(server.start)(host, port)
    try:
        # grpclib types this AbstractServer | None; start() set it to the Server that create_server returns
        listener = server._server
        assert isinstance(listener, asyncio.Server)
        bound = listener.sockets[0].getsockname()[1]
        task_status.started(bound)
        await trio.sleep_forever()
    finally:
        server.close()
        with trio.move_on_after(2.0, shield=True):
            await aio(server.wait_closed)()
