"""Bad requests get an OpenAI error object with the right status, never a 500 or a hang."""

from __future__ import annotations

import json
import re

import httpx
import pytest
import trio
from support import start_frontend, start_mock_engine

from trio_direct.anthropic.errors import anthropic_error_body
from trio_direct.surfaces.routes import ROUTES

pytestmark = pytest.mark.slow

CHAT = "/v1/chat/completions"
TEXT = "/v1/completions"
MODEL = "{model}"
HELLO = [{"role": "user", "content": "Hello"}]

#: (name, method, path, body (bytes, or JSON with {model} filled in), status, param or None)
CASES: list[tuple[str, str, str, bytes | dict | None, int, str | None]] = [
    ("malformed JSON", "POST", CHAT, b"{not json", 400, None),
    ("body is a list", "POST", CHAT, b"[1, 2]", 400, None),
    ("empty body", "POST", CHAT, b"", 400, None),
    ("missing model", "POST", CHAT, {"messages": HELLO}, 400, "model"),
    ("missing messages", "POST", CHAT, {"model": MODEL}, 400, "messages"),
    ("messages not a list", "POST", CHAT, {"model": MODEL, "messages": "hi"}, 400, "messages"),
    ("empty messages", "POST", CHAT, {"model": MODEL, "messages": []}, 400, "messages"),
    ("content of wrong type", "POST", CHAT, {"model": MODEL, "messages": [{"role": "user", "content": 5}]}, 400, None),
    ("unknown role", "POST", CHAT, {"model": MODEL, "messages": [{"role": "boss", "content": "x"}]}, 400, None),
    ("max_tokens zero", "POST", CHAT, {"model": MODEL, "messages": HELLO, "max_tokens": 0}, 400, "max_tokens"),
    ("max_tokens negative", "POST", CHAT, {"model": MODEL, "messages": HELLO, "max_tokens": -5}, 400, "max_tokens"),
    ("max_tokens a string", "POST", CHAT, {"model": MODEL, "messages": HELLO, "max_tokens": "ten"}, 400, "max_tokens"),
    ("temperature too high", "POST", CHAT, {"model": MODEL, "messages": HELLO, "temperature": 9}, 400, "temperature"),
    ("n zero", "POST", CHAT, {"model": MODEL, "messages": HELLO, "n": 0}, 400, "n"),
    (
        "image part",
        "POST",
        CHAT,
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}],
        },
        400,
        None,
    ),
    ("unknown model", "POST", CHAT, {"model": "gpt-17", "messages": HELLO}, 404, "model"),
    (
        "stream_options without stream",
        "POST",
        CHAT,
        {"model": MODEL, "messages": HELLO, "stream_options": {"include_usage": True}},
        400,
        "stream_options",
    ),
    ("prompt too long", "POST", TEXT, {"model": MODEL, "prompt": [5] * 40000}, 400, None),
    ("empty prompt", "POST", TEXT, {"model": MODEL, "prompt": ""}, 400, "prompt"),
    ("token id out of vocabulary", "POST", TEXT, {"model": MODEL, "prompt": [5, 10**7]}, 400, "prompt"),
    ("negative token id", "POST", TEXT, {"model": MODEL, "prompt": [5, -1]}, 400, None),
    ("suffix", "POST", TEXT, {"model": MODEL, "prompt": "a", "suffix": "b"}, 400, "suffix"),
    (
        "body too large",
        "POST",
        CHAT,
        {"model": MODEL, "messages": [{"role": "user", "content": "x" * 300_000}]},
        413,
        None,
    ),
    ("wrong method", "GET", CHAT, None, 405, None),
    ("unknown route", "POST", "/v1/nothing", {}, 404, None),
]


async def test_bad_requests_get_openai_errors(aio_loop, nursery):
    engine = await start_mock_engine(nursery, "--speedup", "inf", "--incremental-streaming-output")
    base = await start_frontend(nursery, "--engine-url", engine.url, "--max-body-bytes", "200000")
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        model = (await client.get("/v1/models")).json()["data"][0]["id"]
        failures = []
        for name, method, path, body, status, param in CASES:
            if isinstance(body, dict):
                body = json.dumps(body).replace(MODEL, model).encode()
            with trio.fail_after(10):
                response = await client.request(
                    method, path, content=body, headers={"Content-Type": "application/json"}
                )
            try:
                error = response.json()["error"]
                assert response.status_code == status, (response.status_code, error)
                assert isinstance(error["message"], str) and error["message"]
                assert set(error) == {"message", "type", "param", "code"}
                if param is not None:
                    assert error["param"] == param, error
            except (AssertionError, ValueError, KeyError) as failure:
                failures.append(f"{name}: {failure!r} / {response.status_code} {response.text[:200]}")
        assert not failures, "\n".join(failures)
        # and the server still serves well-formed requests afterwards
        ok = await client.post(CHAT, json={"model": model, "messages": HELLO, "max_tokens": 2})
        assert ok.status_code == 200


#: Bodies that are not valid UTF-8 (msgspec raises UnicodeDecodeError, not a DecodeError, for most):
#: in a value, in a key, a truncated sequence, an encoded surrogate, and raw bytes before any JSON.
NOT_UTF8 = [
    b'{"model": "\xff", "messages": [], "prompt": "\xff", "input": "\xff", "text": "\xff", "url": "\xff"}',
    b'{"\xff": 1}',
    b'{"model": "m", "prompt": "ab\xe2\x82"}',
    b'{"model": "m", "input": "\xed\xa0\x80"}',
    b"\xff\xfe{}",
]
#: and other bodies no route can read: nested past the decoder's depth, not an object
MALFORMED = [b'{"model": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", b"[1]", b"{"]
ADMIN_KEY = "admin-secret"


def error_of(route, response: httpx.Response) -> dict:
    """The error object of `response`, in the envelope of `route`'s API (fails on any other shape)."""
    body = response.json()
    if route.error_body is anthropic_error_body:
        assert set(body) == {"type", "error"} and body["type"] == "error", body
        assert set(body["error"]) == {"type", "message"}, body
    else:
        assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    assert body["error"]["message"], body
    return body["error"]


async def test_a_body_not_utf8_or_malformed_gets_a_400_in_its_routes_envelope_on_every_route(aio_loop, nursery):
    """Every route of the route table that reads a body, so a route added later is covered too."""
    engine = await start_mock_engine(nursery, "--speedup", "inf", "--incremental-streaming-output")
    base = await start_frontend(nursery, "--engine-url", engine.url, "--admin-api-key", ADMIN_KEY)
    routes = [route for route in ROUTES.routes if route.method in ("POST", "PUT", "PATCH")]
    assert {"/v1/chat/completions", "/v1/messages", "/admin/engines", "/generate"} <= {r.path for r in routes}
    failures = []
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        for route in routes:
            path = re.sub(r"\{[^}]*\}", "x", route.path)
            headers = {"content-type": "application/json"}
            if route.admin:
                headers["authorization"] = f"Bearer {ADMIN_KEY}"
            for body in NOT_UTF8 + MALFORMED:
                with trio.fail_after(10):
                    response = await client.request(route.method, path, content=body, headers=headers)
                try:
                    assert response.status_code == 400, response.status_code
                    error_of(route, response)
                except (AssertionError, ValueError, KeyError) as failure:
                    failures.append(f"{route.method} {path} {body[:24]!r}: {failure!r} / {response.text[:200]}")
        assert not failures, "\n".join(failures)
        model = (await client.get("/v1/models")).json()["data"][0]["id"]
        ok = await client.post(CHAT, json={"model": model, "messages": HELLO, "max_tokens": 2})
        assert ok.status_code == 200
