"""hypercorn 0.18 and h11 0.16 behaviours that `trio_direct.http` works around or builds on.

`http/connection.py` and `http/server.py` override hypercorn internals. Each test here fails when an
upgrade changes what they were written against: then re-read those modules, and drop what the
upgrade made unnecessary.
"""

from __future__ import annotations

import inspect
import time
from importlib.metadata import version

import h11
import hypercorn
import hypercorn.trio
import pytest
import trio
from hypercorn.protocol import ProtocolWrapper
from hypercorn.protocol.h11 import H11Protocol
from hypercorn.trio.tcp_server import TCPServer
from support import exchange, read_response, sockets_in_close_wait

from trio_direct.http.connection import LastRequestConnection
from trio_direct.http.server import hypercorn_config


def test_the_versions_the_overrides_were_written_for():
    assert version("hypercorn") == "0.18.0"
    assert version("h11") == "0.16.0"


def test_the_hypercorn_internals_the_overrides_use_are_still_there():
    parameters = ["self", "app", "config", "context", "state", "stream"]
    assert list(inspect.signature(TCPServer.__init__).parameters) == parameters
    for name in ("run", "_read_data", "_close", "_idle_timeout", "protocol_send"):
        assert inspect.iscoroutinefunction(getattr(TCPServer, name)), name
    for name in ("_check_protocol", "_handle_events", "_create_stream", "_maybe_recycle"):
        assert inspect.iscoroutinefunction(getattr(H11Protocol, name)), name
    assert {"initiate", "handle"} <= set(vars(ProtocolWrapper))
    source = inspect.getsource(TCPServer.run)
    assert "ProtocolWrapper(" in source and "self.idle_task.restart" in source and "self._read_data()" in source
    assert "self.connection: h11.Connection" in inspect.getsource(H11Protocol.__init__)


def test_the_app_hand_off_and_keep_alive_timer_the_connection_replaces_are_still_hypercorns():
    from hypercorn.trio.task_group import TaskGroup, _handle

    assert list(inspect.signature(TaskGroup.spawn_app).parameters) == ["self", "app", "config", "scope", "send"]
    spawn_app = inspect.getsource(TaskGroup.spawn_app)
    assert "open_memory_channel" in spawn_app and "app_receive_channel.receive" in spawn_app and "_handle," in spawn_app
    assert list(inspect.signature(_handle).parameters) == [
        "app", "config", "scope", "receive", "send", "sync_spawn", "call_soon",
    ]  # fmt: skip
    timer = inspect.getsource(TCPServer._idle_timeout)
    assert "keep_alive_timeout" in timer and "terminated.wait()" in timer and "_initiate_server_close()" in timer
    assert "Updated(idle=True)" in inspect.getsource(H11Protocol._maybe_recycle)
    assert "Updated(idle=False)" in inspect.getsource(H11Protocol._handle_events)


REQUEST_WITH_BOTH = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 40\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
HIDDEN = b"GET /hidden HTTP/1.1\r\nHost: x\r\n\r\n"


def test_h11_frames_a_body_with_both_length_headers_by_its_chunks_so_a_request_can_hide_behind_it():
    connection = h11.Connection(h11.SERVER)
    connection.receive_data(REQUEST_WITH_BOTH + HIDDEN)
    assert isinstance(connection.next_event(), h11.Request)
    assert isinstance(connection.next_event(), h11.EndOfMessage)  # the 40 bytes were never counted
    assert connection.next_event() is h11.PAUSED  # the hidden request waits for its turn


def test_h11_calls_bytes_after_a_connections_last_request_an_error_and_ours_leaves_them_unread():
    last = b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    plain = h11.Connection(h11.SERVER)
    plain.receive_data(last + HIDDEN)
    assert isinstance(plain.next_event(), h11.Request) and isinstance(plain.next_event(), h11.EndOfMessage)
    try:
        plain.next_event()
        raise AssertionError("h11 accepted bytes after the last request")
    except h11.RemoteProtocolError:
        pass  # hypercorn would then close in the middle of the answer
    ours = LastRequestConnection(h11.SERVER)
    ours.receive_data(last + HIDDEN)
    assert isinstance(ours.next_event(), h11.Request) and isinstance(ours.next_event(), h11.EndOfMessage)
    assert ours.next_event() is h11.NEED_DATA and ours.their_state is h11.MUST_CLOSE


STREAM_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache"), (b"date", b"x")]


@pytest.mark.parametrize(
    ("request_head", "status", "headers"),
    [
        (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", 200, STREAM_HEADERS),  # a stream: the short way
        (b"POST /v1 HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", 200, STREAM_HEADERS),
        (b"HEAD / HTTP/1.1\r\nHost: x\r\n\r\n", 200, STREAM_HEADERS),
        (b"GET / HTTP/1.0\r\n\r\n", 200, STREAM_HEADERS),
        (b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 200, STREAM_HEADERS),
        (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", 200, [*STREAM_HEADERS, (b"Connection", b"close")]),
        (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", 200, [*STREAM_HEADERS, (b"content-length", b"5")]),
        (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", 200, [*STREAM_HEADERS, (b"transfer-encoding", b"Chunked")]),
        (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", 204, STREAM_HEADERS),
        (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", 304, STREAM_HEADERS),
    ],
)
def test_our_response_heads_are_h11s_byte_for_byte(request_head: bytes, status: int, headers: list) -> None:
    # `LastRequestConnection` skips h11's re-validation of a streamed response's headers.
    heads = []
    for connection in (h11.Connection(h11.SERVER), LastRequestConnection(h11.SERVER)):
        connection.receive_data(request_head)
        assert isinstance(connection.next_event(), h11.Request)
        head = connection.send(h11.Response(status_code=status, headers=headers))
        heads.append((head, connection.our_state, connection._cstate.keep_alive, type(connection._writer)))
    assert heads[0] == heads[1]


def test_our_date_header_is_hypercorns():
    ours, theirs = hypercorn_config("127.0.0.1", 0), hypercorn.Config()
    for include_date, include_server in [(True, True), (True, False), (False, True)]:
        ours.include_date_header = theirs.include_date_header = include_date
        ours.include_server_header = theirs.include_server_header = include_server
        while True:  # both read within one second
            second = int(time.time())
            mine, hypercorns = ours.response_headers("h11"), theirs.response_headers("h11")
            if int(time.time()) == second:
                break
        assert mine == hypercorns


async def plain_hypercorn(nursery: trio.Nursery, app, keep_alive_timeout: float) -> int:
    config = hypercorn.Config()
    config.bind = ["127.0.0.1:0"]
    config.keep_alive_timeout = keep_alive_timeout
    config.loglevel = "WARNING"
    binds = await nursery.start(hypercorn.trio.serve, app, config)
    return int(binds[0].rsplit(":", 1)[1])


async def test_plain_hypercorn_keeps_a_connection_the_client_closed_until_its_keep_alive_timer_fires(nursery, app):
    port = await plain_hypercorn(nursery, app, keep_alive_timeout=30)
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        await stream.send_all(b"GET /live HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (await read_response(stream)).endswith(b"ok")
        await trio.sleep(0.2)
    await trio.sleep(0.5)
    assert sockets_in_close_wait(port) == 1  # GuardedConnection releases it at once


async def test_plain_hypercorn_switches_to_http2_on_an_h2c_upgrade(nursery, app):
    port = await plain_hypercorn(nursery, app, keep_alive_timeout=0.5)
    upgrade = (
        b"GET /live HTTP/1.1\r\nHost: x\r\nUpgrade: h2c\r\nConnection: Upgrade, HTTP2-Settings\r\n"
        b"HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n"
    )
    assert (await exchange(port, upgrade)).startswith(b"HTTP/1.1 101 ")  # HTTP11Protocol ignores the upgrade


PIPELINED = b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\nGET /live HTTP/1.1\r\nHost: x\r\n\r\n"


async def test_plain_hypercorn_holds_its_drain_for_a_pipelined_request_until_the_graceful_timeout(nursery, app):
    config = hypercorn.Config()
    config.bind = ["127.0.0.1:0"]
    config.graceful_timeout = 2
    config.loglevel = "WARNING"
    shutdown, drained = trio.Event(), trio.Event()

    async def serve(*, task_status: trio.TaskStatus[list[str]]) -> None:
        await hypercorn.trio.serve(app, config, shutdown_trigger=shutdown.wait, task_status=task_status)
        drained.set()

    port = int((await nursery.start(serve))[0].rsplit(":", 1)[1])
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        await stream.send_all(PIPELINED)  # the first streams for ~1 s, the second waits its turn
        await trio.sleep(0.2)
        shutdown.set()
        with trio.move_on_after(1.5):  # the stream is done after ~1 s; the drain still waits
            await drained.wait()
        assert not drained.is_set()  # GuardedConnection drains at once: test_connections
        with trio.fail_after(5):
            await drained.wait()
