"""A streamed response's head and end written straight to the connection under `serve`.

`/direct-chunks` writes as `Exchange` does under `serve` (`start_direct_response`, `DirectBody`);
`/chunks` sends the same through ASGI, as hypercorn alone would. A client must not be able to tell
them apart: same bytes, same keep-alive, same handling of what only ASGI handles.
"""

from __future__ import annotations

import json
import re

import httpx
import hypercorn.config
import pytest
import trio
from support import exchange, read_to_eof, start_frontend, start_mock_engine

from trio_direct.http import connection

_DATE = re.compile(rb"\r\ndate: [^\r]*\r\n")


def _comparable(response: bytes) -> bytes:
    """The response without its Date header's value (it may change between two requests)."""
    return _DATE.sub(b"\r\ndate: -\r\n", response)


def get(path: bytes, *headers: bytes, version: bytes = b"1.1", method: bytes = b"GET") -> bytes:
    lines = [b"%s %s HTTP/%s" % (method, path, version), b"Host: x", *headers]
    return b"\r\n".join(lines) + b"\r\n\r\n"


async def read_chunked(stream: trio.SocketStream) -> bytes:
    """One whole chunked response on a connection that stays open."""
    received = b""
    with trio.fail_after(10):
        while not received.endswith(b"\r\n0\r\n\r\n"):
            received += await stream.receive_some(65536)
    return received


@pytest.fixture
def writes(monkeypatch) -> list[bytes]:
    """Each write `serve` makes to a client connection, as it goes on the wire (with the bytes held
    for it)."""
    written: list[bytes] = []
    write = connection.GuardedConnection._write

    async def recording(self, data: bytes) -> None:
        written.append(self._held + data)
        await write(self, data)

    monkeypatch.setattr(connection.GuardedConnection, "_write", recording)
    return written


async def test_a_direct_stream_is_byte_for_byte_what_hypercorn_writes(start_server, app):
    port = await start_server()
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        await stream.send_all(get(b"/chunks"))
        through_asgi = await read_chunked(stream)
        await stream.send_all(get(b"/direct-chunks"))
        direct = await read_chunked(stream)
    assert app.direct == [True]
    assert direct.startswith(b"HTTP/1.1 200 \r\n") and direct.endswith(b"5\r\ndone\n\r\n0\r\n\r\n")
    assert b"x-padded: kept\r\n" in direct  # stripped, as hypercorn strips header values
    assert b"Transfer-Encoding: chunked\r\n" in direct
    assert _comparable(direct) == _comparable(through_asgi)


async def test_the_head_goes_out_at_once_before_a_quiet_streams_first_chunk(start_server, app):
    """A client learns its request was accepted (the status) without waiting for the first event."""
    port = await start_server()
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        await stream.send_all(get(b"/direct-chunks?quiet"))  # 0.3 s before its first chunk
        with trio.fail_after(0.25):
            first = await stream.receive_some(65536)
        assert first.startswith(b"HTTP/1.1 200 ") and first.endswith(b"Transfer-Encoding: chunked\r\n\r\n")
        rest = await read_chunked(stream)
    assert rest.startswith(b"b\r\ndata: one\n\n\r\n") and rest.endswith(b"done\n\r\n0\r\n\r\n")
    assert app.direct == [True]


async def test_a_kept_alive_connection_serves_direct_streams_one_after_another(start_server, app):
    port = await start_server(keep_alive_timeout=0.5)
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        first = None
        for path in (b"/direct-chunks", b"/chunks", b"/direct-chunks"):
            await stream.send_all(get(path))
            answer = _comparable(await read_chunked(stream))
            first = first or answer
            assert answer == first
        assert app.direct == [True, True]
        # Then idle: the keep-alive timeout runs from the last answer and closes the connection.
        with trio.move_on_after(5) as waiting:
            assert await read_to_eof(stream) == b""
        assert not waiting.cancelled_caught


async def test_the_next_request_is_served_as_soon_as_a_direct_stream_ends(start_server, app):
    """As after an ASGI answer's end: the connection is readied for its next request at once, while
    the app still works on after the answer."""
    port = await start_server()
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        await stream.send_all(get(b"/direct-chunks?linger"))
        await read_chunked(stream)
        with trio.fail_after(1):  # the first app lingers for 2 s
            await stream.send_all(get(b"/direct-chunks"))
            await read_chunked(stream)
    assert app.direct == [True, True]


@pytest.mark.parametrize(
    ("request_", "reason"),
    [
        (get(b"/direct-chunks", version=b"1.0"), "an HTTP/1.0 client gets a body delimited by the close"),
        (get(b"/direct-chunks", b"Connection: close"), "the client closes after this answer"),
        (get(b"/direct-chunks", method=b"HEAD"), "a HEAD answer has no body"),
        (get(b"/direct-chunks?length"), "a declared length is not chunked"),
    ],
)
async def test_other_responses_go_through_asgi_unchanged(start_server, app, request_, reason):
    port = await start_server(keep_alive_timeout=0.3)  # a kept-alive answer is read to the close
    direct = await exchange(port, request_)
    through_asgi = await exchange(port, request_.replace(b"/direct-chunks", b"/chunks"))
    assert app.direct == [False], reason
    assert _comparable(direct) == _comparable(through_asgi), reason
    assert direct.startswith(b"HTTP/1.1 200 ")


async def test_a_header_h11_refuses_is_refused_as_through_asgi(start_server, app):
    port = await start_server()
    direct = await exchange(port, get(b"/direct-chunks?bad", b"Connection: close"))
    through_asgi = await exchange(port, get(b"/chunks?bad", b"Connection: close"))
    assert app.direct == [False]
    assert b"a\r\nb" not in direct  # no header splitting
    assert _comparable(direct) == _comparable(through_asgi)


@pytest.mark.parametrize(("path", "ending"), [(b"/direct-chunks", b"0\r\n\r\n"), (b"/direct-whole", b'"}')])
async def test_the_last_request_hypercorn_keeps_alive_for_is_answered_with_a_close(
    start_server, app, monkeypatch, path, ending
):
    monkeypatch.setattr(hypercorn.config.Config, "keep_alive_max_requests", 2)
    port = await start_server()
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        await stream.send_all(get(path))
        await (read_chunked if b"chunks" in path else read_whole)(stream)
        await stream.send_all(get(path))
        last = await read_to_eof(stream)
    assert app.direct == [True, False]
    assert b"connection: close\r\n" in last and last.endswith(ending)


async def test_a_client_gone_before_the_end_is_seen_and_its_connection_released(start_server, app):
    port = await start_server()
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    await stream.send_all(get(b"/direct-chunks?slow"))
    with trio.fail_after(10):
        while b"data: three" not in await stream.receive_some(65536):
            pass
    await stream.aclose()  # before the end, 0.3 s later
    await trio.sleep(0.6)
    assert app.direct == [True]
    # The server is still serving, and the next client gets a whole answer.
    async with await trio.open_tcp_stream("127.0.0.1", port) as again:
        await again.send_all(get(b"/direct-chunks"))
        assert (await read_chunked(again)).endswith(b"done\n\r\n0\r\n\r\n")


async def test_outside_serve_no_response_is_direct():
    assert await connection.start_direct_response({"type": "http"}, 200, []) is None


async def test_a_streamed_chats_last_events_go_out_in_one_write_with_its_end(nursery, writes):
    """Under `serve`, the events that end a stream (the finish reason, usage, ``[DONE]``) go out in
    one write with the body's terminating chunk: a write is a system call and a wake-up of the
    client each. The head goes out first, alone, as soon as the request is on its engine."""
    engine = await start_mock_engine(nursery, "--speedup", "inf")
    base = await start_frontend(nursery, "--engine-url", engine.url)
    host, port = base.removeprefix("http://").rsplit(":", 1)
    async with httpx.AsyncClient(base_url=base) as client:
        model = (await client.get("/v1/models")).json()["data"][0]["id"]
    body = json.dumps({
        "model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
        "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
    }).encode()  # fmt: skip
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    async with await trio.open_tcp_stream(host, int(port)) as stream:
        for _ in range(3):  # kept alive: every answer the same way
            writes.clear()
            await stream.send_all(head + b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            answer = await read_chunked(stream)
            assert answer.startswith(b"HTTP/1.1 200 ") and answer.count(b'"finish_reason":"length"') == 1
            assert writes[0].startswith(b"HTTP/1.1 200 ") and writes[0].endswith(b"chunked\r\n\r\n")
            last = writes[-1]
            assert b'"finish_reason":"length"' in last and b"[DONE]" in last and last.endswith(b"\r\n0\r\n\r\n")
            assert b"".join(writes) == answer


# --- whole responses of declared length (`Exchange.json`: non-streamed answers and errors) ----------


async def read_whole(stream: trio.SocketStream) -> bytes:
    """One whole response of declared length on a connection that stays open."""
    received = b""
    with trio.fail_after(10):
        while True:
            head, found, body = received.partition(b"\r\n\r\n")
            declared = re.search(rb"(?i)\r\ncontent-length: *(\d+)", head + b"\r\n")
            if found and declared is not None and len(body) >= int(declared.group(1)):
                return received
            received += await stream.receive_some(65536)


async def test_a_direct_whole_response_is_hypercorns_bytes_in_one_write(start_server, app, writes):
    port = await start_server()
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        await stream.send_all(get(b"/whole"))
        through_asgi = await read_whole(stream)
        asgi_writes, writes[:] = [w for w in writes if w], []
        await stream.send_all(get(b"/direct-whole"))
        direct = await read_whole(stream)
    assert app.direct == [True]
    assert direct.startswith(b"HTTP/1.1 200 \r\n") and direct.endswith(b'"}')
    assert b"x-padded: kept\r\n" in direct and b"Transfer-Encoding" not in direct
    assert _comparable(direct) == _comparable(through_asgi)
    assert writes == [direct] and len(asgi_writes) == 2  # one system call where ASGI takes two (head, body)


async def test_a_kept_alive_connection_serves_direct_whole_responses_one_after_another(start_server, app):
    port = await start_server(keep_alive_timeout=0.5)
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        answers = []
        for path in (b"/direct-whole", b"/whole", b"/direct-whole", b"/direct-chunks", b"/direct-whole"):
            await stream.send_all(get(path))
            read = read_chunked if b"chunks" in path else read_whole
            answers.append(_comparable(await read(stream)))
        assert app.direct == [True, True, True, True]
        assert answers[0] == answers[1] == answers[2] == answers[4]
        with trio.move_on_after(5) as waiting:  # idle: the keep-alive timeout closes it
            assert await read_to_eof(stream) == b""
        assert not waiting.cancelled_caught


async def test_the_next_request_is_served_as_soon_as_a_direct_whole_response_is_written(start_server, app):
    port = await start_server()
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        await stream.send_all(get(b"/direct-whole?linger"))
        await read_whole(stream)
        with trio.fail_after(1):  # the first app lingers for 2 s after its answer
            await stream.send_all(get(b"/direct-whole"))
            await read_whole(stream)
    assert app.direct == [True, True]


@pytest.mark.parametrize(
    ("request_", "reason"),
    [
        (get(b"/direct-whole", version=b"1.0"), "an HTTP/1.0 client's connection closes"),
        (get(b"/direct-whole", b"Connection: close"), "the client closes after this answer"),
        (get(b"/direct-whole", method=b"HEAD"), "a HEAD answer has no body"),
        (get(b"/direct-whole?bad", b"Connection: close"), "a header h11 refuses"),
        (get(b"/direct-whole?wrong-length", b"Connection: close"), "a length that is not the body's"),
    ],
)
async def test_other_whole_responses_go_through_asgi_unchanged(start_server, app, request_, reason):
    port = await start_server(keep_alive_timeout=0.3)
    direct = await exchange(port, request_)
    through_asgi = await exchange(port, request_.replace(b"/direct-whole", b"/whole"))
    assert app.direct == [False], reason
    assert _comparable(direct) == _comparable(through_asgi), reason
    assert b"a\r\nb" not in direct


async def test_non_streamed_chats_and_errors_are_answered_in_one_write_each(nursery, writes):
    """Under `serve`, a whole JSON answer (a non-streamed chat, an error) goes out as one write of
    head and body, on a connection kept alive across them."""
    engine = await start_mock_engine(nursery, "--speedup", "inf")
    base = await start_frontend(nursery, "--engine-url", engine.url)
    host, port = base.removeprefix("http://").rsplit(":", 1)
    async with httpx.AsyncClient(base_url=base) as client:
        model = (await client.get("/v1/models")).json()["data"][0]["id"]
    chat = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}).encode()
    wrong = json.dumps({"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]}).encode()
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    async with await trio.open_tcp_stream(host, int(port)) as stream:
        for body, status in ((chat, 200), (wrong, 404), (chat, 200)):
            writes.clear()
            await stream.send_all(head + b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            answer = await read_whole(stream)
            assert answer.startswith(b"HTTP/1.1 %d " % status)
            payload = json.loads(answer.partition(b"\r\n\r\n")[2])
            assert ("choices" in payload) == (status == 200) and ("error" in payload) == (status != 200)
            assert writes == [answer]
