"""Hostile and careless clients against `trio-direct serve`: raw sockets on loopback, as an attacker probes.

Timeouts under test are set short by flags, all others far longer than a test, so what closes a
connection is the limit under test; `fail_after` bounds only guard against hangs.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from functools import partial

import httpx
import openai
import pytest
import trio
from support import exchange, read_response, read_to_eof, sockets_in_close_wait, start_frontend, wait_until

pytestmark = pytest.mark.slow

LONG = "60"
CHAT = "/v1/chat/completions"


def status_of(response: bytes) -> int:
    return int(response.split(b" ", 2)[1])


def body_of(response: bytes) -> dict:
    return json.loads(response.split(b"\r\n\r\n", 1)[1])


def port_of(base: str) -> int:
    return int(base.rsplit(":", 1)[1])


async def test_a_declared_body_over_the_limit_gets_413_before_any_of_it_is_sent(aio_loop, nursery):
    base = await start_frontend(nursery, "--mock-speedup", "inf", "--max-body-bytes", "100000")
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100001\r\n\r\n"
    response = await exchange(port_of(base), head)  # the server closes without waiting for the body
    assert status_of(response) == 413 and b"connection: close" in response
    assert body_of(response)["error"]["code"] == "payload_too_large"

    def with_the_openai_client() -> None:  # a client that sends the whole body still reads the 413
        client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
        with pytest.raises(openai.APIStatusError) as refused:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x" * 3_000_000}])
        assert refused.value.status_code == 413

    await trio.to_thread.run_sync(with_the_openai_client)


async def test_a_request_smuggled_behind_content_length_and_transfer_encoding_is_not_answered(aio_loop, nursery):
    base = await start_frontend(nursery, "--mock-speedup", "inf")
    hidden = b"0\r\n\r\nGET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"
    request = b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n" % (
        CHAT.encode(), len(hidden),
    ) + b"Transfer-Encoding: chunked\r\n\r\n"  # fmt: skip
    for _ in range(10):
        response = await exchange(port_of(base), request + hidden)  # read until the server closes
        assert response.count(b"HTTP/1.1 ") == 1 and status_of(response) == 400
        assert body_of(response)["error"]["type"] == "invalid_request_error"
        assert b'"object":"list"' not in response  # the hidden /v1/models was never served


async def test_websocket_and_http2_attempts_get_clear_answers_and_log_no_traceback(aio_loop, nursery, caplog):
    base = await start_frontend(nursery, "--mock-speedup", "inf")
    port = port_of(base)
    caplog.set_level(logging.INFO)
    for path in ("/v1/models", "/v1/realtime", "/anything"):
        handshake = (
            b"GET %s HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n" % path.encode()
        )
        response = await exchange(port, handshake)
        assert status_of(response) == 400 and body_of(response)["error"]["code"] == "websocket_not_supported"
    h2c = (
        b"GET /live HTTP/1.1\r\nHost: x\r\nUpgrade: h2c\r\nConnection: Upgrade, HTTP2-Settings, close\r\n"
        b"HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n"
    )
    assert status_of(await exchange(port, h2c)) == 200  # served in HTTP/1.1, as if the upgrade were not asked
    assert status_of(await exchange(port, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")) == 505
    noisy = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert not noisy, [r.getMessage() for r in noisy]


async def test_short_read_timeouts_never_cut_a_streamed_completion(aio_loop, nursery):
    base = await start_frontend(
        nursery, "--mock-speedup", "0.2", "--header-read-timeout", "0.2", "--body-read-timeout", "0.2",
        "--keep-alive-timeout", "0.2",
    )  # fmt: skip
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        model = (await client.get("/v1/models")).json()["data"][0]["id"]
        body = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 40, "stream": True}
        started = trio.current_time()
        async with client.stream("POST", CHAT, json=body) as response:
            lines = [line async for line in response.aiter_lines() if line]
    assert lines[-1] == "data: [DONE]" and len(lines) > 10
    assert trio.current_time() - started > 0.4  # the stream outlasted the timeouts (else the test proves nothing)


async def test_a_slowloris_head_and_a_stalled_body_are_cut_off(aio_loop, nursery):
    base = await start_frontend(
        nursery, "--mock-speedup", "inf", "--header-read-timeout", "0.5", "--body-read-timeout", "0.5",
        "--keep-alive-timeout", LONG,
    )  # fmt: skip
    port = port_of(base)
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        with trio.fail_after(10):
            try:
                for byte in b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 500:
                    await stream.send_all(bytes([byte]))
                    await trio.sleep(0.02)
            except trio.BrokenResourceError:
                pass
        assert status_of(await read_to_eof(stream)) == 408
    stalled = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\n\r\n{"
    response = await exchange(port, stalled)
    assert status_of(response) == 408 and body_of(response)["error"]["code"] == "request_timeout"


async def test_connections_a_client_closed_are_released_at_once(aio_loop, nursery):
    base = await start_frontend(nursery, "--mock-speedup", "inf", "--keep-alive-timeout", LONG)
    limits = httpx.Limits(max_keepalive_connections=50)
    for _ in range(3):
        client = httpx.AsyncClient(base_url=base, timeout=30, limits=limits)
        async with client, trio.open_nursery() as requests:
            for _ in range(30):
                requests.start_soon(client.get, "/v1/models")
        # the client closed its 30 kept-alive connections
        await wait_until(lambda: sockets_in_close_wait(port_of(base)) == 0, timeout=5)


# --- the process's open-file limit ------------------------------------------------------------------


@dataclass
class Server:
    """`trio-direct serve` run under ``ulimit -n``, and what it logged."""

    process: trio.Process
    log: list[str] = field(default_factory=list)

    def logged(self, pattern: str) -> list[str]:
        return [line for line in self.log if re.search(pattern, line)]


async def start_limited(nursery: trio.Nursery, open_files: int, *args: str) -> tuple[Server, int]:
    serve = [sys.executable, "-m", "trio_direct", "serve", "--port", "0", "--mock-speedup", "inf", *args]
    command = ["sh", "-c", f"ulimit -n {open_files} && exec {shlex.join(serve)}"]
    process = await nursery.start(partial(trio.run_process, command, stderr=subprocess.PIPE, check=False))
    server = Server(process)

    async def read_log() -> None:
        pending = b""
        async for data in process.stderr:
            *lines, pending = (pending + data).split(b"\n")
            server.log.extend(line.decode(errors="replace") for line in lines)

    nursery.start_soon(read_log)
    await wait_until(lambda: server.logged(r"OpenAI API for model.* on http://") != [], timeout=60)
    address = re.search(r"on (http://\S+)", server.logged(r"OpenAI API for model")[0])
    assert address is not None
    base = address[1]
    return server, port_of(base)


async def flood(port: int, count: int, opened: list[trio.SocketStream]) -> None:
    """Open up to `count` connections that each send half a request head (connects that hang are dropped)."""

    async def one() -> None:
        with trio.move_on_after(3):
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            opened.append(stream)
            with contextlib.suppress(trio.BrokenResourceError):
                await stream.send_all(b"GET /live HTTP/1.1\r\n")

    async with trio.open_nursery() as connecting:
        for _ in range(count):
            connecting.start_soon(one)


async def health(stream: trio.SocketStream) -> int:
    await stream.send_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    return status_of(await read_response(stream))


async def test_past_the_connection_cap_new_connections_are_refused_at_once_and_served_ones_carry_on(nursery):
    server, port = await start_limited(nursery, 256, "--header-read-timeout", LONG)
    announced = re.search(r"at most (\d+) client connections", server.logged(r"at most \d+ client")[0])
    assert announced is not None
    cap = int(announced[1])
    assert cap == 256 - 64  # the open-file limit less its reserve
    opened: list[trio.SocketStream] = []
    try:
        async with await trio.open_tcp_stream("127.0.0.1", port) as kept:
            assert await health(kept) == 200
            await flood(port, cap + 40, opened)
            outcomes: list[bytes] = []

            async def outcome(stream: trio.SocketStream) -> None:
                with trio.move_on_after(2):  # admitted ones wait for the rest of their head
                    outcomes.append(await read_to_eof(stream))

            async with trio.open_nursery() as reading:
                for stream in opened:
                    reading.start_soon(outcome, stream)
            refused = [o for o in outcomes if o.startswith(b"HTTP/1.1 503 ")]
            assert len(opened) == cap + 40 and len(refused) == 40 + 1  # `kept` holds one place
            assert await health(kept) == 200
    finally:
        for stream in opened:
            await stream.aclose()
    assert not server.logged(r"cannot accept|Traceback|EMFILE")
    assert len(server.logged(r"refusing connections: \d+ are open")) == 1  # once per interval, not per refusal


async def test_when_accept_runs_out_of_file_descriptors_it_logs_once_and_recovers_by_itself(nursery):
    server, port = await start_limited(nursery, 256, "--max-connections", "2000", "--header-read-timeout", LONG)
    assert server.logged(r"--max-connections 2000 leaves fewer than")  # the operator is told at start
    opened: list[trio.SocketStream] = []
    try:
        async with await trio.open_tcp_stream("127.0.0.1", port) as kept:
            assert await health(kept) == 200
            await flood(port, 400, opened)  # more than the server's 256 files and its listen backlog
            await wait_until(lambda: server.logged(r"cannot accept connections: EMFILE") != [], timeout=10)
            await trio.sleep(1)  # ten retries of accept
            assert await health(kept) == 200  # the connections it has are still served
    finally:
        for stream in opened:
            await stream.aclose()
    with trio.fail_after(20):
        while True:  # new connections are accepted again once files are free
            async with await trio.open_tcp_stream("127.0.0.1", port) as fresh:
                with trio.move_on_after(2):
                    if await health(fresh) == 200:
                        break
    assert len(server.logged(r"cannot accept connections")) <= 2  # not one line per failed accept
    assert server.logged(r"accepting connections again")
    assert not server.logged(r"Traceback|trio.serve_listeners")
    server.process.terminate()
