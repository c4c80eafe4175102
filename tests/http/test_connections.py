"""The HTTP server against careless and hostile clients: real sockets on loopback, a small ASGI app.

Timeouts under test are short; every other timeout is far longer than the test, so what closes a
connection is the limit under test. `fail_after` bounds only guard against hangs.
"""

from __future__ import annotations

import contextlib
import json
import socket
import struct

import trio
from support import exchange, read_response, read_to_eof, sockets_in_close_wait, wait_until

from trio_direct.http import connection

HEAD = b"GET /live HTTP/1.1\r\nHost: x\r\n\r\n"
#: Any timeout not under test: far beyond the test's own duration.
LONG = 60.0
BOTH_LENGTHS = b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\nTransfer-Encoding: chunked\r\n\r\n"


def status_of(response: bytes) -> int:
    return int(response.split(b" ", 2)[1])


def body_of(response: bytes) -> dict:
    return json.loads(response.split(b"\r\n\r\n", 1)[1])


# --- read deadlines ---------------------------------------------------------------------------------


async def test_a_partial_request_head_is_answered_408_and_the_connection_closed(start_server):
    port = await start_server(header_read_timeout=0.3, body_read_timeout=LONG)
    response = await exchange(port, b"GET /live HTTP/1.1\r\nHost: x\r\n")  # no blank line: never complete
    assert status_of(response) == 408
    assert body_of(response)["error"]["code"] == "request_timeout"


async def test_a_head_trickled_byte_by_byte_is_timed_from_its_start_not_per_byte(start_server, app):
    port = await start_server(header_read_timeout=0.5, body_read_timeout=LONG)
    head = b"GET /live HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 200 + b"\r\n\r\n"
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        with trio.fail_after(10):
            try:
                for byte in head:  # one byte every 50 ms: 12 s in all, each gap far below the timeout
                    await stream.send_all(bytes([byte]))
                    await trio.sleep(0.05)
            except trio.BrokenResourceError:
                pass  # the server closed the connection
        response = await read_to_eof(stream)
    assert status_of(response) == 408 and app.paths == []


async def test_a_connection_that_never_sends_a_byte_is_closed_without_an_answer(start_server):
    port = await start_server(header_read_timeout=0.3, body_read_timeout=LONG)
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        assert await read_to_eof(stream) == b""


async def test_a_stalled_body_is_answered_408_and_the_app_sees_the_client_go(start_server, app):
    port = await start_server(header_read_timeout=LONG, body_read_timeout=0.3)
    response = await exchange(port, b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
    assert status_of(response) == 408
    assert "stalled" in body_of(response)["error"]["message"]
    await wait_until(lambda: app.disconnects == 1)


async def test_a_body_that_keeps_coming_is_read_however_slowly(start_server):
    port = await start_server(header_read_timeout=LONG, body_read_timeout=0.5)
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        await stream.send_all(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 8\r\nConnection: close\r\n\r\n")
        for _ in range(8):  # 8 x 0.2 s: longer than the timeout in all, never a pause as long
            await trio.sleep(0.2)
            await stream.send_all(b"x")
        response = await read_to_eof(stream)
    assert status_of(response) == 200 and response.endswith(b"\r\n\r\n8")


async def test_a_long_streamed_response_to_a_quiet_client_outlives_every_read_timeout(start_server):
    port = await start_server(header_read_timeout=0.2, body_read_timeout=0.2, keep_alive_timeout=0.2)
    response = await exchange(port, b"GET /stream HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")  # ~1 s
    assert status_of(response) == 200 and b"chunk 9\n" in response and b"done\n" in response


async def test_an_idle_kept_alive_connection_is_closed_after_the_keep_alive_timeout(start_server):
    port = await start_server(header_read_timeout=LONG, body_read_timeout=LONG, keep_alive_timeout=0.3)
    response = await exchange(port, HEAD)  # answered, then idle until the server closes it
    assert status_of(response) == 200 and response.endswith(b"ok")


async def test_the_keep_alive_timeout_runs_from_each_answer_not_from_the_first(start_server):
    port = await start_server(header_read_timeout=LONG, body_read_timeout=LONG, keep_alive_timeout=0.6)
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        for _ in range(4):  # 1.2 s on one connection, never idle for 0.6 s
            await stream.send_all(HEAD)
            assert (await read_response(stream)).endswith(b"ok")
            await trio.sleep(0.3)
        await stream.send_all(b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")  # ~1 s: busy is never idle
        streamed = b""
        with trio.fail_after(10):
            while not streamed.endswith(b"0\r\n\r\n"):  # the chunked body's end
                streamed += await stream.receive_some(65536)
            assert b"done\n" in streamed
            assert await read_to_eof(stream) == b""  # then idle past the timeout: closed


async def test_an_idle_kept_alive_connection_is_closed_at_once_when_the_server_drains(start_server):
    shutdown, drained = trio.Event(), trio.Event()
    port = await start_server(shutdown=shutdown, drained=drained, keep_alive_timeout=LONG)
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        await stream.send_all(HEAD)
        assert (await read_response(stream)).endswith(b"ok")
        shutdown.set()
        with trio.fail_after(10):  # the keep-alive timeout is 60 s, the graceful timeout 30 s
            assert await read_to_eof(stream) == b""
            await drained.wait()


async def test_a_kept_alive_connection_times_its_next_head_from_its_first_byte(start_server):
    port = await start_server(header_read_timeout=0.5, body_read_timeout=LONG)
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        for _ in range(3):  # idle gaps longer than the header timeout between whole requests are fine
            await stream.send_all(HEAD)
            assert (await read_response(stream)).endswith(b"ok")
            await trio.sleep(0.7)
        await stream.send_all(b"GET /live HTTP/1.1\r\n")
        assert status_of(await read_to_eof(stream)) == 408


# --- connections the client closed ------------------------------------------------------------------


async def test_connections_a_client_closed_while_idle_are_released_at_once(start_server):
    port = await start_server(header_read_timeout=LONG, body_read_timeout=LONG, keep_alive_timeout=LONG)
    async with trio.open_nursery() as clients:
        for _ in range(50):
            clients.start_soon(one_request_then_close, port)
    # hypercorn alone keeps each until its keep-alive timer (here 60 s) fires: see test_hypercorn_pins
    await wait_until(lambda: sockets_in_close_wait(port) == 0, timeout=5)


async def one_request_then_close(port: int) -> None:
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        await stream.send_all(HEAD)
        assert (await read_response(stream)).endswith(b"ok")
        await trio.sleep(0.2)  # the server is idle on the connection, waiting for the next request


# --- framing -----------------------------------------------------------------------------------------


async def test_a_request_smuggled_behind_content_length_and_transfer_encoding_is_never_served(start_server, app):
    port = await start_server(header_read_timeout=LONG, body_read_timeout=LONG)
    hidden = b"0\r\n\r\nGET /live HTTP/1.1\r\nHost: x\r\n\r\n"
    request = BOTH_LENGTHS % len(hidden)
    for _ in range(20):  # the answer and the close race the hidden request's arrival: try several times
        response = await exchange(port, request + hidden)
        assert status_of(response) == 400 and response.count(b"HTTP/1.1 ") == 1
        assert b"connection: close" in response.lower()
        assert body_of(response)["error"]["code"] == "conflicting_framing"
    assert app.paths == []  # neither request reached the app


async def test_framing_errors_are_answered_and_the_connection_closed(start_server, app):
    port = await start_server(header_read_timeout=LONG, body_read_timeout=LONG)
    cases = {
        b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n": 400,  # bad chunk size
        b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n": 501,
        b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}": 400,
        b"GET /live HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n": 400,
    }
    for request, status in cases.items():
        response = await exchange(port, request + HEAD)  # a second request after the bad one
        assert status_of(response) == status, request[:60]
        assert response.count(b"HTTP/1.1 ") == 1, request[:60]
    assert "/live" not in app.paths
    unfinished = b"GET /live HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20000  # a head over h11's 16 KiB
    assert status_of(await exchange(port, unfinished)) == 431


async def test_a_declared_body_over_the_limit_is_refused_before_it_is_sent(start_server, app):
    port = await start_server(max_body_bytes=1000, header_read_timeout=LONG, body_read_timeout=LONG)
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        await stream.send_all(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1001\r\n\r\n")  # and no body
        response = await read_to_eof(stream)
    assert status_of(response) == 413 and b"connection: close" in response
    assert body_of(response)["error"]["code"] == "payload_too_large" and app.paths == []
    head = b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\nConnection: close\r\n\r\n"
    within = await exchange(port, head + b"x" * 1000)
    assert status_of(within) == 200 and within.endswith(b"1000")


async def test_the_413_reaches_a_client_that_is_still_uploading(start_server):
    port = await start_server(max_body_bytes=1000, header_read_timeout=LONG, body_read_timeout=LONG)
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        await stream.send_all(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 4000000\r\n\r\n")
        try:
            for _ in range(40):  # 4 MB after the answer was sent: closing at once would reset the connection
                await stream.send_all(b"x" * 100_000)
        except trio.BrokenResourceError:
            pass
        response = await read_to_eof(stream)
    assert status_of(response) == 413


# --- other protocols ---------------------------------------------------------------------------------


async def test_a_websocket_handshake_gets_400_in_openais_envelope(start_server, app):
    port = await start_server(header_read_timeout=LONG, body_read_timeout=LONG)
    handshake = (
        b"GET /v1/models HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    response = await exchange(port, handshake)
    assert status_of(response) == 400 and body_of(response)["error"]["code"] == "websocket_not_supported"
    assert app.paths == []


async def test_http2_is_not_spoken_the_h2c_upgrade_is_ignored_and_the_preface_refused(start_server):
    port = await start_server(header_read_timeout=LONG, body_read_timeout=LONG)
    upgrade = (
        b"GET /live HTTP/1.1\r\nHost: x\r\nUpgrade: h2c\r\nConnection: Upgrade, HTTP2-Settings\r\n"
        b"HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\nConnection: close\r\n\r\n"
    )
    response = await exchange(port, upgrade)
    assert status_of(response) == 200 and response.endswith(b"ok")  # answered in HTTP/1.1, no 101
    response = await exchange(port, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
    assert status_of(response) == 505 and body_of(response)["error"]["code"] == "http_version_not_supported"


# --- the connection cap and the drain ----------------------------------------------------------------


async def test_connections_over_the_cap_are_refused_at_once_and_admitted_again_when_one_closes(start_server):
    port = await start_server(max_connections=3, header_read_timeout=LONG, body_read_timeout=LONG)
    async with contextlib.AsyncExitStack() as stack:
        admitted = [await stack.enter_async_context(await trio.open_tcp_stream("127.0.0.1", port)) for _ in range(3)]
        for stream in admitted:
            await stream.send_all(HEAD)
            assert (await read_response(stream)).endswith(b"ok")
        refused = await exchange(port, b"")  # a new connection: answered before it says anything
        assert status_of(refused) == 503 and b"retry-after: 1" in refused
        assert body_of(refused)["error"]["type"] == "service_unavailable"
        await admitted[0].send_all(HEAD)  # those admitted are served as before
        assert (await read_response(admitted[0])).endswith(b"ok")
        await admitted[-1].aclose()
        with trio.fail_after(10):
            while True:  # the closed connection's place is free again, once the server noticed
                response = await exchange(port, b"GET /live HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                if status_of(response) == 200:
                    break
                await trio.sleep(0.05)


async def test_after_every_kind_of_bad_request_the_server_still_drains_at_once(start_server):
    shutdown, drained = trio.Event(), trio.Event()
    port = await start_server(shutdown=shutdown, drained=drained, header_read_timeout=LONG, body_read_timeout=LONG)
    hidden = b"0\r\n\r\nGET /live HTTP/1.1\r\nHost: x\r\n\r\n"
    bad = [
        BOTH_LENGTHS % len(hidden) + hidden,
        b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n{",
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
        b"GET /live HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n" + HEAD,  # pipelined after a close
    ]
    for request in bad * 3:
        assert await exchange(port, request)
    shutdown.set()
    with trio.fail_after(10):  # the graceful timeout is 30 s: only a connection left behind would hold it
        await drained.wait()


async def test_a_pipelining_client_does_not_hold_the_drain(start_server):
    shutdown, drained = trio.Event(), trio.Event()
    port = await start_server(shutdown=shutdown, drained=drained, header_read_timeout=LONG, body_read_timeout=LONG)
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        await stream.send_all(b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n" + HEAD)  # the second waits its turn
        await trio.sleep(0.2)
        shutdown.set()
        response = await read_to_eof(stream)  # the stream finishes; the waiting request is not served
        assert b"done\n" in response and response.count(b"HTTP/1.1 ") == 1
        with trio.fail_after(10):  # the graceful timeout is 30 s
            await drained.wait()


# --- second round: trickled bodies, strict framing, clients that stop reading or reset at the end -----


async def test_a_body_trickled_under_the_pause_limit_still_meets_its_total_deadline(start_server, app):
    port = await start_server(header_read_timeout=LONG, body_read_timeout=0.5, body_total_timeout=1.0)
    started = trio.current_time()
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        await stream.send_all(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n")
        with trio.move_on_after(5):
            with contextlib.suppress(trio.BrokenResourceError):
                while True:  # one byte every 0.3 s: never a pause as long as the pause limit
                    await stream.send_all(b"x")
                    await trio.sleep(0.3)
        response = await read_to_eof(stream)
    assert status_of(response) == 408 and trio.current_time() - started < 3
    await wait_until(lambda: app.disconnects == 1)


async def test_a_nul_byte_in_a_chunk_extension_is_a_400(start_server, app):
    head = b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    response = await exchange(port := await start_server(), head + b"2;ext=a\x00b\r\nhi\r\n0\r\n\r\n")
    assert status_of(response) == 400
    fine = await exchange(
        port, head.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n") + b"2;ext=ab\r\nhi\r\n0\r\n\r\n"
    )
    assert status_of(fine) == 200 and fine.endswith(b"2")


async def test_a_method_that_is_not_upper_case_is_a_400_not_served(start_server, app):
    port = await start_server()
    response = await exchange(port, b"get /live HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status_of(response) == 400 and "upper-case" in body_of(response)["error"]["message"]
    assert app.paths == []


async def test_a_client_that_stops_reading_is_cut_after_the_write_timeout_and_the_app_sees_it_go(start_server, app):
    port = await start_server(client_write_timeout=0.5)
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        await stream.send_all(b"GET /flood HTTP/1.1\r\nHost: x\r\n\r\n")
        await stream.receive_some(1024)  # the answer began; from now on nothing is read
        await wait_until(lambda: app.disconnects == 1, timeout=10)


async def test_a_slow_client_that_keeps_reading_is_never_cut(start_server, app):
    port = await start_server(client_write_timeout=0.5)
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        await stream.send_all(b"GET /flood HTTP/1.1\r\nHost: x\r\n\r\n")
        with trio.move_on_after(1.5):  # slower than the server writes, but never a pause of 0.5 s
            while await stream.receive_some(16384):
                await trio.sleep(0.05)
    await wait_until(lambda: app.disconnects == 1)  # it went when the client closed, not before


async def test_connections_reset_right_after_their_answers_last_bytes_are_released_at_once(start_server):
    """A client that resets as soon as it read the last event (SSE clients close at ``[DONE]``): the
    terminating chunk is still being written while the read loop sees the reset, and the answer's end
    then restarted the keep-alive timer (here 60 s) in hypercorn's connection task."""
    from trio_direct.metrics import HTTP_CONNECTIONS

    port = await start_server(keep_alive_timeout=LONG)
    before = HTTP_CONNECTIONS._value.get()

    async def reset_at_the_end() -> None:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        stream.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = reset
        await stream.send_all(b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")
        received = b""
        while b"done\n" not in received:
            received += await stream.receive_some(65536)
        stream.socket.close()

    async with trio.open_nursery() as clients:
        for _ in range(100):
            clients.start_soon(reset_at_the_end)
    await wait_until(lambda: HTTP_CONNECTIONS._value.get() == before, timeout=2)


# --- answers given before the request's body was read -----------------------------------------------

EARLY = b"POST /live HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"  # /live answers without reading a body


async def test_a_body_that_arrives_after_the_early_answer_is_discarded_and_the_next_request_served(start_server):
    port = await start_server(header_read_timeout=LONG, body_read_timeout=LONG)
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        await stream.send_all(EARLY % 10 + b"01234")
        assert status_of(await read_response(stream)) == 200
        await trio.sleep(0.1)
        await stream.send_all(b"56789" + HEAD)  # the rest of the body, then the next request
        assert status_of(await read_response(stream)) == 200
        chunked = b"POST /live HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nabcde\r\n"
        await stream.send_all(chunked)
        assert status_of(await read_response(stream)) == 200
        await trio.sleep(0.1)
        await stream.send_all(b"0\r\n\r\n" + HEAD)
        assert status_of(await read_response(stream)) == 200


async def test_an_early_answer_does_not_read_a_large_unread_body_forever(start_server, monkeypatch):
    monkeypatch.setattr(connection, "LINGER_TIME", 0.5)  # how long a closed connection's answer lingers
    port = await start_server(max_body_bytes=100_000, header_read_timeout=LONG, body_read_timeout=LONG)
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        await stream.send_all(b"POST /live HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        assert status_of(await read_response(stream)) == 200
        chunk = b"%x\r\n%s\r\n" % (65536, b"x" * 65536)
        with trio.fail_after(15):  # an endless body: past the discard limit the server closes
            try:
                while True:
                    await stream.send_all(chunk)
            except trio.BrokenResourceError:
                pass


# --- a request refused before its body was read (a missing API key), on a kept-alive connection ------

BODY = b'{"model": "x", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}'


def post(path: bytes, length: int, *headers: bytes) -> bytes:
    return b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n" % (
        path,
        length,
        b"".join(header + b"\r\n" for header in headers),
    )


def header_of(response: bytes, name: bytes) -> bytes | None:
    for line in response.split(b"\r\n\r\n", 1)[0].lower().split(b"\r\n")[1:]:
        key, _, value = line.partition(b":")
        if key == name:
            return value.strip()
    return None


async def test_a_request_refused_for_its_key_before_its_body_was_read_leaves_the_connection_usable(start_server):
    """The head and the body go in two writes, as HTTP client libraries send them: the server may
    answer 401 before the body's bytes were taken from the connection (an app answered without a
    task switch), and the next request on the connection must still be answered."""
    port = await start_server(header_read_timeout=LONG, body_read_timeout=LONG)
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        for _ in range(20):
            await stream.send_all(post(b"/guarded", len(BODY)))
            await stream.send_all(BODY)
            refused = await read_response(stream)
            assert status_of(refused) == 401 and header_of(refused, b"connection") is None
            await stream.send_all(post(b"/guarded", len(BODY), b"Authorization: Bearer s3cret") + BODY)
            served = await read_response(stream)
            assert status_of(served) == 200 and served.endswith(b"\r\n\r\n%d" % len(BODY))


async def test_a_body_still_arriving_after_the_refusal_is_read_past_and_the_next_request_served(start_server):
    port = await start_server(header_read_timeout=LONG, body_read_timeout=LONG)
    for path in (b"/guarded", b"/guarded-slow"):  # refused at once, or after a key lookup
        async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
            await stream.send_all(post(path, len(BODY)) + BODY[:10])
            assert status_of(await read_response(stream)) == 401
            await trio.sleep(0.2)  # the refusal was written; the rest of the body comes later
            await stream.send_all(BODY[10:])
            await stream.send_all(HEAD)
            assert status_of(await read_response(stream)) == 200
            chunked = b"POST %s HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" % path
            await stream.send_all(chunked + b"a\r\n" + BODY[:10] + b"\r\n")
            assert status_of(await read_response(stream)) == 401
            await trio.sleep(0.2)
            rest = BODY[10:]
            await stream.send_all(b"%x\r\n%s\r\n0\r\n\r\n" % (len(rest), rest) + HEAD)
            assert status_of(await read_response(stream)) == 200


async def test_a_refused_request_with_a_huge_body_is_closed_in_bounded_time(start_server, monkeypatch):
    """A body far larger than is worth reading past: the refusal says ``Connection: close`` when the
    body's declared length shows it, and the connection closes soon, whether the refusal came at
    once or after the body had filled the app's queue."""
    monkeypatch.setattr(connection, "LINGER_TIME", 0.5)  # how long a closed connection's answer lingers
    port = await start_server(max_body_bytes=1 << 30, header_read_timeout=LONG, body_read_timeout=LONG)
    for path in (b"/guarded", b"/guarded-slow"):
        async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
            await stream.send_all(post(path, 64 << 20))
            received = bytearray()

            async def upload() -> None:
                with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                    for _ in range(1024):  # 64 MiB
                        await stream.send_all(b"x" * 65536)

            with trio.fail_after(10):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(upload)
                    received += await read_to_eof(stream)
                    nursery.cancel_scope.cancel()
            assert status_of(bytes(received)) == 401
            assert header_of(bytes(received), b"connection") == b"close"
