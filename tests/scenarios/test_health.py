"""Engines that die and come back: health checks take them out of routing and bring them back."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from functools import partial

import httpx
import pytest
import trio
from support import engine_accounting, start_frontend, start_mock_engine

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def start_on_port(nursery, port: int) -> trio.Process:
    command = [sys.executable, "-m", "trio_direct", "mock-engine", "--port", str(port), "--speedup", "inf",
               "--incremental-streaming-output"]  # fmt: skip
    process = await nursery.start(partial(trio.run_process, command, stdout=subprocess.PIPE, check=False))
    with trio.fail_after(30):
        assert json.loads(await process.stdout.receive_some())["port"] == port
    return process


async def test_a_dead_engine_leaves_routing_and_rejoins_when_it_is_back(aio_loop, nursery):
    port = free_port()
    flaky = await start_on_port(nursery, port)
    steady = await start_mock_engine(nursery, "--speedup", "inf", "--incremental-streaming-output")
    base = await start_frontend(
        nursery, "--engine-url", f"127.0.0.1:{port}", "--engine-url", steady.url,
        "--health-interval", "0.2", "--health-timeout", "0.5",
    )  # fmt: skip
    body = {"model": "", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        body["model"] = (await client.get("/v1/models")).json()["data"][0]["id"]
        flaky.kill()
        await flaky.wait()
        statuses = [(await client.post("/v1/chat/completions", json=body)).status_code for _ in range(8)]
        assert statuses.count(200) >= 7, statuses  # at most the first request meets the dead engine
        assert all(status in (200, 503) for status in statuses)
        assert (await client.get("/health")).status_code == 200
        before = (await engine_accounting(steady.url))["started"]

        await start_on_port(nursery, port)
        with trio.fail_after(10):  # back in routing within a few health intervals
            while True:
                await client.post("/v1/chat/completions", json=body)
                if (await engine_accounting(f"grpc://127.0.0.1:{port}"))["started"] > 0:
                    break
                await trio.sleep(0.1)
        for _ in range(4):
            assert (await client.post("/v1/chat/completions", json=body)).status_code == 200
    assert (await engine_accounting(steady.url))["started"] > before


async def test_no_healthy_engine_means_503_then_recovery(aio_loop, nursery):
    port = free_port()
    only = await start_on_port(nursery, port)
    base = await start_frontend(nursery, "--engine-url", f"127.0.0.1:{port}", "--health-interval", "0.2")
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        model = (await client.get("/v1/models")).json()["data"][0]["id"]
        body = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
        only.kill()
        await only.wait()
        with trio.fail_after(10):
            while (await client.get("/health")).status_code != 503:
                await trio.sleep(0.1)
        reply = await client.post("/v1/chat/completions", json=body)
        assert reply.status_code == 503 and reply.json()["error"]["type"]
        await start_on_port(nursery, port)
        with trio.fail_after(10):
            while (await client.get("/health")).status_code != 200:
                await trio.sleep(0.1)
        assert (await client.post("/v1/chat/completions", json=body)).status_code == 200


async def test_a_request_to_an_unreachable_engine_is_retried_on_another(aio_loop, nursery):
    port = free_port()
    doomed = await start_on_port(nursery, port)
    steady = await start_mock_engine(nursery, "--speedup", "inf", "--incremental-streaming-output")
    # health checks far apart: only the failing requests themselves can notice the dead engine
    base = await start_frontend(
        nursery, "--engine-url", f"127.0.0.1:{port}", "--engine-url", steady.url, "--health-interval", "60"
    )
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        model = (await client.get("/v1/models")).json()["data"][0]["id"]
        body = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
        doomed.kill()
        await doomed.wait()
        statuses = [(await client.post("/v1/chat/completions", json=body)).status_code for _ in range(4)]
        streamed = await client.post("/v1/chat/completions", json=body | {"stream": True})
    assert statuses == [200] * 4
    assert streamed.status_code == 200 and "[DONE]" in streamed.text and '"error"' not in streamed.text


async def test_a_stream_whose_engine_dies_ends_with_an_error_chunk_within_a_second(aio_loop, nursery):
    from support import RawSseClient

    engine = await start_mock_engine(nursery, "--incremental-streaming-output")  # real time: ~6 ms a token
    base = await start_frontend(nursery, "--engine-url", engine.url, "--health-interval", "60")
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        model = (await client.get("/v1/models")).json()["data"][0]["id"]
    body = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 500, "stream": True}
    events = []
    killed_at = None
    with trio.fail_after(20):
        async for event in RawSseClient(base).events("/v1/chat/completions", body):
            events.append((trio.current_time(), event))
            if len(events) == 5:
                engine.process.kill()
                killed_at = trio.current_time()
    errors = [(at, e) for at, e in events if isinstance(e, dict) and "error" in e]
    assert events[-1][1] == "[DONE]" and len(errors) == 1
    assert killed_at is not None and errors[0][0] - killed_at < 1.0
