"""Engines that hang (SIGSTOP: alive to TCP, silent to everyone) cost a request seconds, not the hang.

Before its first token a request whose engine hangs is retried on another engine at once, and the
hung engine leaves routing when the hang is found, not after its Abort times out. With the default
settings a hung engine is found by its health check going unanswered while its streams produce
nothing; an engine that answers its health check is busy, however long its prefill takes.
"""

from __future__ import annotations

import signal
import time

import httpx
import pytest
import trio
from support import start_frontend, start_mock_engine

pytestmark = pytest.mark.slow

INCREMENTAL = "--incremental-streaming-output"


async def model_of(client: httpx.AsyncClient) -> str:
    return (await client.get("/v1/models")).json()["data"][0]["id"]


def chat(model: str, question: str, max_tokens: int = 8) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": question}], "max_tokens": max_tokens}


async def metric(client: httpx.AsyncClient, name: str) -> float:
    lines = (await client.get("/metrics")).text.splitlines()
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith(name + " "))


async def timed_chat(client: httpx.AsyncClient, body: dict, into: list) -> None:
    started = time.perf_counter()
    reply = await client.post("/v1/chat/completions", json=body)
    into.append((reply.status_code, time.perf_counter() - started))


async def test_a_request_whose_engine_hangs_before_its_first_token_is_retried_at_once(aio_loop, nursery):
    hung, healthy = [await start_mock_engine(nursery, INCREMENTAL, "--speedup", "inf") for _ in range(2)]
    # No health check runs within the test: only the stall detection can find the hung engine. An
    # Abort timeout far longer than what a request may take shows that nothing waits for that Abort.
    base = await start_frontend(
        nursery, "--engine-url", hung.url, "--engine-url", healthy.url, "--stream-idle-timeout", "2",
        "--abort-timeout", "20", "--health-interval", "600", "--max-retries", "1",
    )  # fmt: skip
    async with httpx.AsyncClient(base_url=base, timeout=60) as client:
        model = await model_of(client)
        retries = await metric(client, "trio_direct_retries_total")
        hung.process.send_signal(signal.SIGSTOP)
        try:
            results: list = []
            async with trio.open_nursery() as chats:
                for i in range(4):
                    chats.start_soon(timed_chat, client, chat(model, f"question {i}"), results)
            assert [status for status, _ in results] == [200] * 4, results
            assert max(took for _, took in results) < 10, results  # stall (2 s) + retry, not the Abort's 20 s
            assert await metric(client, "trio_direct_retries_total") >= retries + 1  # two met the hung engine
            routable = {w["engine"] for w in (await client.get("/debug/routing")).json()["workers"]}
            assert "e0" not in routable
            later: list = []
            for i in range(6):  # the hung engine is out of routing: nothing waits on it any more
                await timed_chat(client, chat(model, f"later {i}"), later)
            assert all(status == 200 and took < 2 for status, took in later), later
        finally:
            hung.process.send_signal(signal.SIGCONT)


async def test_with_the_defaults_a_stopped_engine_holds_no_request_past_20_seconds(aio_loop, nursery):
    stopped, steady = [await start_mock_engine(nursery, INCREMENTAL, "--speedup", "0.5") for _ in range(2)]
    base = await start_frontend(nursery, "--engine-url", stopped.url, "--engine-url", steady.url)
    async with httpx.AsyncClient(base_url=base, timeout=60, limits=httpx.Limits(max_connections=50)) as client:
        model = await model_of(client)
        results: list = []
        try:
            async with trio.open_nursery() as chats:
                for i in range(10):  # under way on both engines when one stops
                    chats.start_soon(timed_chat, client, chat(model, f"story {i}", max_tokens=300), results)
                await trio.sleep(0.5)
                stopped.process.send_signal(signal.SIGSTOP)
                for i in range(9):  # and new requests keep coming while it is stopped
                    await trio.sleep(0.5)
                    chats.start_soon(timed_chat, client, chat(model, f"new {i}", max_tokens=20), results)
        finally:
            stopped.process.send_signal(signal.SIGCONT)
        assert [status for status, _ in results] == [200] * 19, results
        assert max(took for _, took in results) < 20, sorted(took for _, took in results)


async def test_a_slow_prefill_on_an_engine_that_answers_its_health_checks_is_never_cut(aio_loop, nursery):
    # ~3 s of prefill with no output at all, then tokens a second apart; health checks every 0.3 s.
    slow = await start_mock_engine(nursery, INCREMENTAL, "--speedup", "0.005")
    other = await start_mock_engine(nursery, INCREMENTAL, "--speedup", "inf")
    base = await start_frontend(
        nursery, "--engine-url", slow.url, "--engine-url", other.url, "--health-interval", "0.3",
        "--health-timeout", "0.5", "--router-mode", "round-robin",
    )  # fmt: skip
    async with httpx.AsyncClient(base_url=base, timeout=60) as client:
        model = await model_of(client)
        stalls = await metric(client, "trio_direct_engine_stalls_total")
        results: list = []
        async with trio.open_nursery() as chats:
            for i in range(2):  # one lands on each engine
                chats.start_soon(timed_chat, client, chat(model, f"long prompt {i}", max_tokens=2), results)
        assert [status for status, _ in results] == [200, 200], results
        assert max(took for _, took in results) > 3  # the slow one was waited for, not moved
        assert await metric(client, "trio_direct_engine_stalls_total") == stalls
        routable = {w["engine"] for w in (await client.get("/debug/routing")).json()["workers"]}
        assert routable == {"e0", "e1"}
