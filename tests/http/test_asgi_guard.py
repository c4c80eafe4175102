"""`ProtocolGuard`: requests answered before the app sees them (413 up front, CL+TE, WebSocket)."""

from __future__ import annotations

import json

import pytest

from trio_direct.core import errors
from trio_direct.http.asgi_guard import ProtocolGuard, refusal
from trio_direct.http.responses import error_response, too_many_connections

LIMIT = 1000


@pytest.mark.parametrize(
    ("headers", "status", "code"),
    [
        ([(b"content-length", b"1001")], 413, "payload_too_large"),
        ([(b"Content-Length", b"999999999999")], 413, "payload_too_large"),
        ([(b"content-length", b"10"), (b"transfer-encoding", b"chunked")], 400, "conflicting_framing"),
        ([(b"transfer-encoding", b"chunked"), (b"content-length", b"10")], 400, "conflicting_framing"),
        ([(b"content-length", b"ten")], 400, "invalid_framing"),
    ],
)
def test_requests_refused_from_their_headers(headers, status, code):
    error = refusal([(b"host", b"x"), *headers], LIMIT)
    assert error is not None and (error.status, error.code) == (status, code)


@pytest.mark.parametrize(
    "headers",
    [[], [(b"content-length", b"1000")], [(b"content-length", b"0")], [(b"transfer-encoding", b"chunked")]],
)
def test_requests_within_the_limit_pass(headers):
    assert refusal(headers, LIMIT) is None


class Recorder:
    """A stand-in app that records what reached it, and the messages a guard sent."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.sent: list[dict] = []

    async def app(self, scope, receive, send) -> None:
        self.seen.append(scope["type"])

    async def send(self, message: dict) -> None:
        self.sent.append(message)


def http_scope(headers, version="1.1"):
    return {"type": "http", "http_version": version, "method": "POST", "path": "/v1/completions", "headers": headers}


async def nothing() -> dict:
    raise AssertionError("the guard must answer without reading the body")


async def test_an_oversized_declared_body_is_answered_413_with_connection_close_and_the_app_never_runs():
    recorder = Recorder()
    guard = ProtocolGuard(recorder.app, max_body_bytes=LIMIT)
    await guard(http_scope([(b"content-length", b"5000")]), nothing, recorder.send)
    assert recorder.seen == []
    start, body = recorder.sent
    assert start["status"] == 413 and (b"connection", b"close") in start["headers"]
    assert json.loads(body["body"])["error"]["code"] == "payload_too_large"
    assert dict(start["headers"])[b"content-length"] == str(len(body["body"])).encode()


async def test_a_request_with_both_length_headers_has_its_chunks_read_before_the_400():
    recorder = Recorder()
    chunks = [{"type": "http.request", "body": b"x" * 600, "more_body": True}] * 5  # past the limit: stop
    received: list[dict] = []

    async def receive() -> dict:
        received.append(chunks[len(received)])
        return received[-1]

    headers = [(b"content-length", b"10"), (b"transfer-encoding", b"chunked")]
    await ProtocolGuard(recorder.app, max_body_bytes=LIMIT)(http_scope(headers), receive, recorder.send)
    assert len(received) == 2 and recorder.seen == []
    assert recorder.sent[0]["status"] == 400 and (b"connection", b"close") in recorder.sent[0]["headers"]


async def test_over_http2_the_answer_has_no_connection_header():
    recorder = Recorder()
    guard = ProtocolGuard(recorder.app, max_body_bytes=LIMIT)
    await guard(http_scope([(b"content-length", b"5000")], "2"), nothing, recorder.send)
    assert b"connection" not in dict(recorder.sent[0]["headers"])


async def test_other_requests_and_the_lifespan_reach_the_app():
    recorder = Recorder()
    guard = ProtocolGuard(recorder.app, max_body_bytes=LIMIT)
    await guard(http_scope([(b"content-length", b"10")]), nothing, recorder.send)
    await guard({"type": "lifespan"}, nothing, recorder.send)
    assert recorder.seen == ["http", "lifespan"] and recorder.sent == []


@pytest.mark.parametrize("extension", [True, False])
async def test_a_websocket_handshake_is_refused(extension):
    recorder = Recorder()
    scope: dict = {"type": "websocket", "path": "/v1/models", "headers": [], "extensions": {}}
    if extension:
        scope["extensions"]["websocket.http.response"] = {}

    async def connect() -> dict:
        return {"type": "websocket.connect"}

    await ProtocolGuard(recorder.app, max_body_bytes=LIMIT)(scope, connect, recorder.send)
    assert recorder.seen == []
    if extension:  # the 400 carries OpenAI's error envelope
        start, body = recorder.sent
        assert (start["type"], start["status"]) == ("websocket.http.response.start", 400)
        assert json.loads(body["body"])["error"]["code"] == "websocket_not_supported"
    else:  # the server answers the closed handshake itself (hypercorn: 403)
        assert recorder.sent == [{"type": "websocket.close", "code": 1008}]


def test_raw_error_responses_are_complete_http_messages():
    raw = error_response(errors.rate_limited("slow down"), retry_after=3)
    head, body = raw.split(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"HTTP/1.1 429 Too Many Requests"
    assert b"connection: close" in lines and b"retry-after: 3" in lines
    assert f"content-length: {len(body)}".encode() in lines
    assert json.loads(body)["error"]["message"] == "slow down"
    assert too_many_connections(10).startswith(b"HTTP/1.1 503 Service Unavailable\r\n")
