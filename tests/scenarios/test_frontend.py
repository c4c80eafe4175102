"""A user in front of `trio-direct serve` with mock SGLang engine processes behind it."""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
from contextlib import aclosing
from functools import partial
from typing import TYPE_CHECKING

import httpx
import pytest
import trio
from support import RawSseClient, engine_accounting, settled_accounts, start_frontend, start_mock_engine

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletionMessageParam

pytestmark = pytest.mark.slow

FAST = ("--speedup", "inf", "--incremental-streaming-output")


async def chat(client: httpx.AsyncClient, model: str, **extra) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 8, **extra}
    return await client.post("/v1/chat/completions", json=body)


async def model_of(client: httpx.AsyncClient) -> str:
    return (await client.get("/v1/models")).json()["data"][0]["id"]


async def sse_events(client: httpx.AsyncClient, path: str, body: dict) -> list:
    events = []
    async with client.stream("POST", path, json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                data = line.removeprefix("data: ")
                events.append(data if data == "[DONE]" else json.loads(data))
    return events


@pytest.mark.parametrize("api", ["native", "smg", "vllm"])
async def test_round_robin_spreads_requests_over_both_engines(aio_loop, nursery, api):
    engines = [await start_mock_engine(nursery, "--api", api, *FAST) for _ in range(2)]
    base = await start_frontend(nursery, *(arg for e in engines for arg in ("--engine-url", e.url)))
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        model = await model_of(client)
        for _ in range(6):
            response = await chat(client, model)
            assert response.status_code == 200
            assert response.json()["choices"][0]["finish_reason"] == "length"
            assert response.json()["usage"]["completion_tokens"] == 8
    if api != "smg":  # accounting is read over the native API, or the vLLM mock's own method
        started = [(await engine_accounting(e.url))["started"] for e in engines]
        assert started == [3, 3]


async def test_streaming_and_unary_give_the_same_text_and_usage(aio_loop, nursery):
    engine = await start_mock_engine(nursery, *FAST)
    base = await start_frontend(nursery, "--engine-url", engine.url)
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        model = await model_of(client)
        unary = (await chat(client, model, seed=7)).json()
        events = await sse_events(
            client,
            "/v1/chat/completions",
            {
                "model": model,
                "messages": [{"role": "user", "content": "Hello there"}],
                "max_tokens": 8,
                "seed": 7,
                "stream": True,
                "stream_options": {"include_usage": True},
            },
        )
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    streamed = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert streamed == unary["choices"][0]["message"]["content"]
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert finishes == ["length"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 8
    assert chunks[-1]["usage"] == unary["usage"] | {
        "prompt_tokens_details": chunks[-1]["usage"]["prompt_tokens_details"]
    }


async def test_the_chat_template_is_compiled_at_start_up_not_by_the_first_chat(aio_loop, nursery):
    from trio_direct.text import chat_template

    chat_template._compile.cache_clear()
    engine = await start_mock_engine(nursery, *FAST)
    base = await start_frontend(nursery, "--engine-url", engine.url)
    compiled = chat_template._compile.cache_info().misses
    assert compiled == 1  # compiled while the frontend started
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        response = await chat(client, await model_of(client))
    assert response.status_code == 200
    assert chat_template._compile.cache_info().misses == compiled  # the first chat found it ready


async def test_start_up_connects_to_every_engine_for_generation(aio_loop, nursery):
    from trio_direct.config import parse_serve_args
    from trio_direct.frontend.runtime import run_frontend

    engines = [await start_mock_engine(nursery, *FAST) for _ in range(2)]
    argv = [arg for engine in engines for arg in ("--engine-url", engine.url)]
    frontend = await nursery.start(run_frontend, parse_serve_args(argv, environ={}))
    # The first request to each engine finds its connection open (it would wait 5-10 ms otherwise).
    assert [engine.client.channel.stream_connections for engine in frontend.pools()[0].fleet.engines] == [1, 1]


async def test_a_repeated_prompt_reports_cached_tokens(aio_loop, nursery):
    engine = await start_mock_engine(nursery, *FAST)
    base = await start_frontend(nursery, "--engine-url", engine.url)
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        model = await model_of(client)
        first = (await chat(client, model)).json()["usage"]
        second = (await chat(client, model)).json()["usage"]
    assert first["prompt_tokens_details"]["cached_tokens"] == 0
    assert second["prompt_tokens_details"]["cached_tokens"] > 0


async def test_an_engine_without_incremental_streaming_gives_the_same_text(aio_loop, nursery):
    incremental = await start_mock_engine(nursery, "--speedup", "inf", "--incremental-streaming-output")
    cumulative = await start_mock_engine(nursery, "--speedup", "inf")
    texts = []
    for engine in (incremental, cumulative):
        async with trio.open_nursery() as frontend_nursery:
            base = await start_frontend(frontend_nursery, "--engine-url", engine.url)
            async with httpx.AsyncClient(base_url=base, timeout=30) as client:
                model = await model_of(client)
                events = await sse_events(
                    client,
                    "/v1/chat/completions",
                    {
                        "model": model,
                        "messages": [{"role": "user", "content": "Hi"}],
                        "max_tokens": 24,
                        "seed": 3,
                        "stream": True,
                    },
                )
            texts.append("".join(e["choices"][0]["delta"].get("content", "") for e in events[:-1]))
            frontend_nursery.cancel_scope.cancel()
    assert texts[0] == texts[1] and len(texts[0]) > 0


async def test_completions_accepts_strings_lists_and_token_ids(aio_loop, nursery):
    engine = await start_mock_engine(nursery, *FAST)
    base = await start_frontend(nursery, "--engine-url", engine.url)
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        model = await model_of(client)
        for prompt, choices in (("Once upon", 1), (["Once upon", "a time"], 2), ([5, 6, 7], 1), ([[5, 6], [7, 8]], 2)):
            response = await client.post("/v1/completions", json={"model": model, "prompt": prompt, "max_tokens": 4})
            assert response.status_code == 200, response.text
            body = response.json()
            assert [c["index"] for c in body["choices"]] == list(range(choices))
            assert body["usage"]["completion_tokens"] == 4 * choices
        echoed = (
            await client.post(
                "/v1/completions", json={"model": model, "prompt": "Echo me", "max_tokens": 2, "echo": True}
            )
        ).json()
        assert echoed["choices"][0]["text"].startswith("Echo me")


@pytest.mark.parametrize("api", ["both", "vllm"])
async def test_n_choices_and_stop_strings(aio_loop, nursery, api):
    engine = await start_mock_engine(nursery, "--api", api, *FAST)
    base = await start_frontend(nursery, "--engine-url", engine.url)
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        model = await model_of(client)
        body = (await chat(client, model, n=3, max_tokens=6)).json()
        assert [c["index"] for c in body["choices"]] == [0, 1, 2]
        assert body["usage"]["completion_tokens"] == 18
        text = (await chat(client, model, seed=11, max_tokens=30)).json()["choices"][0]["message"]["content"]
        stop = text[5:8]
        cut = (await chat(client, model, seed=11, max_tokens=30, stop=[stop])).json()["choices"][0]
        assert cut["finish_reason"] == "stop"
        assert cut["message"]["content"] == text[: text.index(stop)]


async def test_the_official_openai_client_works_for_chat_and_completions(aio_loop, nursery):
    import openai

    engine = await start_mock_engine(nursery, *FAST)
    base = await start_frontend(nursery, "--engine-url", engine.url)

    def use_client() -> None:
        client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
        model = client.models.list().data[0].id
        reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=5)
        assert reply.usage is not None
        assert reply.choices[0].finish_reason == "length" and reply.usage.completion_tokens == 5
        stream = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=5, stream=True
        )
        pieces = [chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices]
        assert len("".join(pieces)) > 0
        text = client.completions.create(model=model, prompt="Once", max_tokens=3)
        assert text.choices[0].finish_reason == "length"
        streamed = list(client.completions.create(model=model, prompt="Once", max_tokens=3, stream=True))
        assert streamed[-1].choices[0].finish_reason == "length"
        with pytest.raises(openai.NotFoundError):
            client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "Hi"}])
        client.close()

    await trio.to_thread.run_sync(use_client)


async def test_two_hundred_random_disconnects_leave_nothing_running(aio_loop, nursery):
    """Every disconnected request that was still generating is aborted once; nothing stays live."""
    engines = [await start_mock_engine(nursery, "--incremental-streaming-output") for _ in range(2)]
    base = await start_frontend(nursery, *(arg for e in engines for arg in ("--engine-url", e.url)))
    rng = random.Random(1234)
    early_rids: set[str] = set()
    limiter = trio.Semaphore(20)

    async def one(client: RawSseClient, model: str) -> None:
        keep = rng.choice([0, 1, 1, 2, 3, 5, 10, 40, 1000])
        body = {"model": model, "messages": [{"role": "user", "content": "Talk"}], "max_tokens": 48, "stream": True}
        async with limiter, aclosing(client.events("/v1/chat/completions", body)) as events:
            seen = 0
            async for event in events:
                if event == "[DONE]":
                    break
                if "role" in event["choices"][0]["delta"]:
                    if keep == 0:
                        break  # gone before any token: the request may not even have been dispatched
                    continue
                if seen == 0 and keep < 4:  # a token arrived, so it runs, and 44+ tokens are still to come
                    early_rids.add(event["id"].removeprefix("chatcmpl-") + "0000")
                seen += 1
                if seen > keep:
                    break  # closing the generator hangs up mid-stream

    async with httpx.AsyncClient(base_url=base, timeout=60) as http:
        model = await model_of(http)
    client = RawSseClient(base)
    async with trio.open_nursery() as requests:
        for _ in range(200):
            requests.start_soon(one, client, model)

    accounts = await settled_accounts([e.url for e in engines], timeout=15)
    abort_rids = [rid for a in accounts for rid, _ in a["abort_rpcs"]]
    assert len(abort_rids) == len(set(abort_rids)), "one Abort per request, never two"
    outcomes = {rid: outcome for a in accounts for rid, outcome in a["outcomes"].items()}
    cut_short = {rid for rid, outcome in outcomes.items() if outcome in ("cancelled", "aborted")}
    assert cut_short <= set(abort_rids), "every request the client left while it ran got its Abort"
    assert cut_short >= {rid for rid in early_rids if outcomes.get(rid) != "finished"}
    for a in accounts:
        assert a["started"] == a["finished"] + a["cancelled"] + a["aborted"]
        # Each request ended by the client going away got its Abort; an Abort may also reach a
        # request whose last token was on the wire when the client left (harmless, unknown rid).
        assert a["cancelled"] + a["aborted"] <= len(a["abort_rpcs"]) <= a["cancelled"] + a["aborted"] + a["finished"]
    assert 150 <= sum(a["started"] for a in accounts) <= 200


async def test_hypercorn_cli_serves_the_app(aio_loop, nursery, tmp_path):

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "TRIO_DIRECT_MOCK_SPEEDUP": "inf"}
    command = [sys.executable, "-m", "hypercorn", "-k", "trio", "--bind", f"127.0.0.1:{port}", "trio_direct.app:app"]
    run = partial(trio.run_process, command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    await nursery.start(run)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:

        async def ready() -> bool:
            try:
                return (await client.get("/health")).status_code == 200
            except httpx.TransportError:
                return False

        with trio.fail_after(60):
            while not await ready():
                await trio.sleep(0.2)
        model = await model_of(client)
        response = await chat(client, model)
        body = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, "stream": True}
        async with client.stream("POST", "/v1/chat/completions", json=body) as streamed:
            lines = [line async for line in streamed.aiter_lines() if line]
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["role"] == "assistant"
    assert lines[-1] == "data: [DONE]" and len(lines) > 2  # streamed through ASGI under plain hypercorn


@pytest.mark.parametrize("api", ["native", "smg", "vllm"])
async def test_logprobs_come_through_in_openai_shape(aio_loop, nursery, api):
    import openai

    engine = await start_mock_engine(nursery, "--api", api, *FAST)
    base = await start_frontend(nursery, "--engine-url", engine.url)

    def use_client() -> None:
        client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
        model = client.models.list().data[0].id
        messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Hi"}]
        reply = client.chat.completions.create(
            model=model, messages=messages, max_tokens=6, logprobs=True, top_logprobs=3
        )
        assert reply.choices[0].logprobs is not None
        content = reply.choices[0].logprobs.content
        assert content is not None
        assert len(content) == 6 and all(len(t.top_logprobs) == 3 for t in content)
        assert all(t.logprob < 0 and t.top_logprobs[0].logprob == t.logprob for t in content)
        streamed = client.chat.completions.create(
            model=model, messages=messages, max_tokens=6, logprobs=True, top_logprobs=2, stream=True
        )
        rows = [
            t
            for chunk in streamed
            if chunk.choices and chunk.choices[0].logprobs
            for t in chunk.choices[0].logprobs.content or ()
        ]
        assert len(rows) == 6 and [len(t.top_logprobs) for t in rows] == [2] * 6
        legacy = client.completions.create(model=model, prompt="Once", max_tokens=5, logprobs=2)
        logprobs = legacy.choices[0].logprobs
        assert logprobs is not None and logprobs.tokens is not None and logprobs.token_logprobs is not None
        assert logprobs.text_offset is not None and logprobs.top_logprobs is not None
        assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(logprobs.text_offset) == 5
        assert all(len(top) <= 2 for top in logprobs.top_logprobs)
        assert logprobs.text_offset == sorted(logprobs.text_offset)
        plain = client.chat.completions.create(model=model, messages=messages, max_tokens=2)
        assert plain.choices[0].logprobs is None
        client.close()

    await trio.to_thread.run_sync(use_client)
