"""Bad requests get an OpenAI error object with the right status, never a 500 or a hang."""

from __future__ import annotations

import json

import httpx
import pytest
import trio
from support import start_frontend, start_mock_engine

pytestmark = pytest.mark.slow

CHAT = "/v1/chat/completions"
TEXT = "/v1/completions"
MODEL = "{model}"
HELLO = [{"role": "user", "content": "Hello"}]

#: (name, method, path, body (bytes, or JSON with {model} filled in), status, param or None)
CASES = [
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
