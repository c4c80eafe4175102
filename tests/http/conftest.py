"""An in-process `serve_http` with a small ASGI app, and raw-socket helpers, for the HTTP server's tests."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio

from trio_direct.http import connection
from trio_direct.http.asgi_guard import ProtocolGuard
from trio_direct.http.limits import ConnectionLimits
from trio_direct.http.server import hypercorn_config, serve_http

#: The keep-alive timeout of tests about other deadlines: far beyond the test's own duration.
LONG = 60.0
#: What `/chunks` and `/direct-chunks` stream before their last "done".
CHUNKS = (b"data: one\n\n", b"data: two\n\n", b"data: three\n\n")


class App:
    """`/live`: 200 "ok"; `/echo`: reads the body, answers its length; `/stream`: 10 chunks 0.1 s apart;
    `/flood`: 64 KiB chunks as fast as they are taken, until the client is gone; `/guarded`: 401
    without ``Authorization: Bearer s3cret``, before reading the body (as the API routes answer a
    missing key), else as `/echo`; `/guarded-slow`: the same after a 0.3 s key check (a shared store).
    `/chunks` and `/direct-chunks`: the same three chunks and "done", through ASGI and as
    `Exchange` writes a stream under `serve` (`start_direct_response`, `DirectBody`, ASGI where
    that returns None; `direct` records which); the query string names headers to add
    (`bad`: a value with a line break, `length`: a Content-Length), `slow` waits 0.3 s before
    the end, and (direct only) `quiet` 0.3 s before the first chunk and `linger` 2 s after the end.
    `/whole` and `/direct-whole`: one JSON body of declared length, through ASGI and as `Exchange.json`
    writes it under `serve` (`send_direct_response`, ASGI where that returns False; `direct` records
    which); the query string as for the chunks (`bad`, `wrong-length`: a Content-Length off by
    one, `linger`)."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        self.disconnects = 0
        #: For each `/direct-chunks` request: whether its head went straight to the connection.
        self.direct: list[bool] = []

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            while (message := await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        self.paths.append(scope["path"])
        if scope["path"] in ("/chunks", "/direct-chunks"):
            await self._chunks(scope, receive, send)
            return
        if scope["path"] in ("/whole", "/direct-whole"):
            await self._whole(scope, receive, send)
            return
        body = b""
        if scope["path"] in ("/guarded", "/guarded-slow"):
            if scope["path"] == "/guarded-slow":
                await trio.sleep(0.3)
            if (b"authorization", b"Bearer s3cret") not in scope["headers"]:
                refusal = b'{"error": {"type": "authentication_error"}}'
                headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(refusal))]
                await send({"type": "http.response.start", "status": 401, "headers": headers})
                await send({"type": "http.response.body", "body": refusal})
                return
        if scope["path"] in ("/echo", "/guarded", "/guarded-slow"):
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    self.disconnects += 1
                    return
                body += message.get("body", b"")
                if not message.get("more_body"):
                    break
            body = str(len(body)).encode()
        elif scope["path"] == "/live":
            body = b"ok"
        headers = [(b"content-type", b"text/plain")]
        if scope["path"] == "/flood":  # 64 KiB chunks until the client is gone
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._count_disconnect, receive, nursery.cancel_scope)
                while True:
                    await send({"type": "http.response.body", "body": b"x" * 65536, "more_body": True})
                    await trio.lowlevel.checkpoint()
        if scope["path"] == "/stream":
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            for index in range(10):
                await trio.sleep(0.1)
                await send({"type": "http.response.body", "body": b"chunk %d\n" % index, "more_body": True})
            await send({"type": "http.response.body", "body": b"done\n"})
            return
        headers.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def _chunks(self, scope, receive, send) -> None:
        while (await receive()).get("more_body"):
            pass
        query = scope["query_string"].split(b"&")
        headers = [(b"content-type", b"text/event-stream"), (b"x-padded", b"  kept  ")]
        if b"bad" in query:
            headers.append((b"x-bad", b"a\r\nb"))
        if b"length" in query:
            headers.append((b"content-length", b"%d" % len(b"".join(CHUNKS) + b"done\n")))
        end = {"type": "http.response.body", "body": b"done\n", "more_body": False}
        direct = None
        if scope["path"] == "/direct-chunks":
            direct = await connection.start_direct_response(scope, 200, headers)
            self.direct.append(direct is not None)
        if direct is None:
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            for chunk in CHUNKS:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            if b"slow" in query:
                await trio.sleep(0.3)
            await send(end)
            return
        if b"quiet" in query:  # before the first chunk
            await trio.sleep(0.3)
        for chunk in CHUNKS:
            await direct.write(chunk)
        if b"slow" in query:
            await trio.sleep(0.3)
        with trio.CancelScope(shield=True) as scope:  # as `Exchange.end` has it: shielded, bounded
            scope.deadline = trio.current_time() + 10
            if direct.can_finish():
                await direct.finish(b"done\n")
            else:
                await direct.write_last(b"done\n", lambda: send(end))
            if b"linger" in query:  # work after the answer's end (our app's access log, metrics)
                await trio.sleep(2)

    async def _whole(self, scope, receive, send) -> None:
        while (await receive()).get("more_body"):
            pass
        query = scope["query_string"].split(b"&")
        body = b'{"object": "whole", "padding": "%b"}' % (b"x" * 300)
        length = len(body) + (1 if b"wrong-length" in query else 0)
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", b"%d" % length),
            (b"x-padded", b" kept "),
        ]
        if b"bad" in query:
            headers.append((b"x-bad", b"a\r\nb"))
        with trio.CancelScope(shield=True) as shield:  # as `Exchange.json` has it: shielded, bounded
            shield.deadline = trio.current_time() + 10
            if scope["path"] == "/direct-whole":
                direct = await connection.send_direct_response(scope, 200, headers, body)
                self.direct.append(direct)
                if direct:
                    if b"linger" in query:
                        await trio.sleep(2)
                    return
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def _count_disconnect(self, receive, scope: trio.CancelScope) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self.disconnects += 1
        scope.cancel()


StartServer = Callable[..., Awaitable[int]]


@pytest.fixture
def app() -> App:
    return App()


@pytest.fixture
def start_server(nursery, app) -> StartServer:
    """`port = await start_server(header_read_timeout=..., ...)`: serve `app` on loopback.

    `shutdown`: set it to drain the server; `drained` is set once the server returned.
    """

    async def start(
        *, max_body_bytes: int = 1000, shutdown: trio.Event | None = None, drained: trio.Event | None = None,
        **limits: Any,
    ) -> int:  # fmt: skip
        limits.setdefault("keep_alive_timeout", LONG)
        connection_limits = ConnectionLimits(**limits)
        config = hypercorn_config("127.0.0.1", 0, "warning", graceful_timeout=30, limits=connection_limits)
        guarded = ProtocolGuard(app, max_body_bytes=max_body_bytes)
        trigger = shutdown.wait if shutdown is not None else None

        async def serve(*, task_status: trio.TaskStatus[list[str]]) -> None:
            await serve_http(guarded, config, connection_limits, shutdown_trigger=trigger, task_status=task_status)
            if drained is not None:
                drained.set()

        binds = await nursery.start(serve)
        return int(binds[0].rsplit(":", 1)[1])

    return start
