"""What an operator relies on: API keys, the concurrency limit, and /metrics."""

from __future__ import annotations

import httpx
import pytest
import trio
from support import start_frontend, start_mock_engine

pytestmark = pytest.mark.slow


async def test_an_api_key_guards_the_api_but_not_the_probes(aio_loop, nursery):
    engine = await start_mock_engine(nursery, "--speedup", "inf", "--incremental-streaming-output")
    base = await start_frontend(nursery, "--engine-url", engine.url, "--api-key", "s3cret")
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        for path in ("/health", "/live", "/metrics"):
            assert (await client.get(path)).status_code == 200, path
        denied = await client.get("/v1/models")
        assert denied.status_code == 401 and denied.json()["error"]["type"]
        body = {"model": "x", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
        assert (await client.post("/v1/chat/completions", json=body)).status_code == 401
        wrong = {"Authorization": "Bearer nope"}
        assert (await client.post("/v1/chat/completions", json=body, headers=wrong)).status_code == 401
        good = {"Authorization": "Bearer s3cret"}
        model = (await client.get("/v1/models", headers=good)).json()["data"][0]["id"]
        reply = await client.post("/v1/chat/completions", json=body | {"model": model}, headers=good)
        assert reply.status_code == 200


async def test_requests_over_the_concurrency_limit_get_429_with_retry_after(aio_loop, nursery):
    engine = await start_mock_engine(nursery, "--incremental-streaming-output")  # real time: slow enough
    base = await start_frontend(nursery, "--engine-url", engine.url, "--max-concurrent-requests", "2")
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        model = (await client.get("/v1/models")).json()["data"][0]["id"]
        body = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 60}
        statuses: list[int] = []
        refused: list[httpx.Response] = []

        async def one() -> None:
            reply = await client.post("/v1/chat/completions", json=body)
            statuses.append(reply.status_code)
            if reply.status_code == 429:
                refused.append(reply)

        async with trio.open_nursery() as requests:
            for _ in range(5):
                requests.start_soon(one)
    assert sorted(statuses) == [200, 200, 429, 429, 429]
    assert all(r.headers["retry-after"] == "1" and r.json()["error"]["type"] == "rate_limit_error" for r in refused)


async def test_metrics_count_requests_tokens_and_engine_health(aio_loop, nursery):
    engine = await start_mock_engine(nursery, "--speedup", "inf", "--incremental-streaming-output")
    base = await start_frontend(nursery, "--engine-url", engine.url)
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        model = (await client.get("/v1/models")).json()["data"][0]["id"]
        body = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}
        await client.post("/v1/chat/completions", json=body)
        await client.post("/v1/chat/completions", json=body | {"stream": True})
        text = (await client.get("/metrics")).text
    assert 'trio_direct_requests_total{endpoint="chat",model="%s",status="200",stream="true"}' % model in text
    assert 'trio_direct_requests_total{endpoint="chat",model="%s",status="200",stream="false"}' % model in text
    assert 'trio_direct_tokens_total{kind="output",model="%s"}' % model in text
    assert "trio_direct_time_to_first_token_seconds_bucket" in text
    assert 'trio_direct_engine_healthy{engine="e0"' in text
    assert "trio_direct_routing_decisions_total" in text
