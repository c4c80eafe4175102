"""A user in front of `trio-direct serve --router-mode kv` with vLLM engines behind it: two
`mock-engine --api vllm` processes (KV events on their gRPC stream, scripted answers from a
Qwen3-style model that calls tools in Hermes markup), the official `openai` SDK as the client."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from contextlib import aclosing
from functools import partial

import httpx
import openai
import pytest
import trio
from openai.types.chat import (
    ChatCompletionFunctionToolParam,
    ChatCompletionMessageFunctionToolCall,
    ChatCompletionMessageParam,
)
from openai.types.shared_params.response_format_json_schema import JSONSchema
from support import RawSseClient, engine_accounting, settled_accounts, start_frontend, start_mock_engine
from surface_scenarios import SCRIPTS

pytestmark = pytest.mark.slow

KV_EVENTS = json.dumps({"publisher": "zmq", "endpoint": "tcp://127.0.0.1:0", "topic": ""})
SYSTEM = "You are a careful assistant. " + " ".join(f"Rule {i}: answer briefly and cite sources." for i in range(40))
TOOLS: list[ChatCompletionFunctionToolParam] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]


async def served_by(engines, rid: str) -> list[int]:
    return [i for i, e in enumerate(engines) if rid in (await engine_accounting(e.url))["first_output_at"]]


async def test_chat_tools_kv_routing_and_disconnects_over_vllm_engines(aio_loop, nursery, tmp_path):
    scripts = tmp_path / "scripts.json"
    scripts.write_text(json.dumps(SCRIPTS))
    # Real-time pacing: a 1000-token answer runs for seconds, so every hang-up below cuts a running one.
    args = ("--api", "vllm", "--kv-events-config", KV_EVENTS, "--scripted-outputs", str(scripts))
    engines = [await start_mock_engine(nursery, *args) for _ in range(2)]
    flags = [a for e in engines for a in ("--engine-url", e.url)]
    base = await start_frontend(
        nursery, "--router-mode", "kv", "--reasoning-parser", "qwen3", "--tool-call-parser", "hermes", *flags
    )

    def use_client() -> list[str]:
        client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
        model = client.models.list().data[0].id
        riddle: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Tell me the riddle answer"}]
        reply = client.chat.completions.create(model=model, messages=riddle, max_tokens=60)
        message = reply.choices[0].message
        assert message.model_extra is not None
        assert (message.content, message.model_extra["reasoning_content"]) == (
            "A piano.",
            "Keys but no locks... a piano.",
        )
        assert reply.usage is not None
        assert reply.choices[0].finish_reason == "stop" and reply.usage.completion_tokens > 0
        streamed = client.chat.completions.create(model=model, messages=riddle, max_tokens=60, stream=True)
        text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
        assert text == "A piano."
        ask: list[ChatCompletionMessageParam] = [{"role": "user", "content": "What is the weather in Paris?"}]
        called = client.chat.completions.create(model=model, messages=ask, tools=TOOLS, max_tokens=100)
        assert called.choices[0].finish_reason == "tool_calls"
        assert called.choices[0].message.tool_calls is not None
        call = called.choices[0].message.tool_calls[0]
        assert isinstance(call, ChatCompletionMessageFunctionToolCall)
        assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", {"city": "Paris"})
        # A long system prompt twice: the second goes where the first left it cached.
        rids = []
        for question in ("First question?", "Second question?"):
            prefixed: list[ChatCompletionMessageParam] = [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": question},
            ]
            rids.append(client.chat.completions.create(model=model, messages=prefixed, max_tokens=3).id)
            if not rids[1:]:
                with httpx.Client(base_url=base) as http:  # the engine's KV events reach the index
                    for _ in range(200):
                        if http.get("/debug/routing").json()["kv"]["index"]["blocks"] > 0:
                            break
                        time.sleep(0.02)
        # Structured output and logprobs reach the engine in the contract's own fields.
        schema: JSONSchema = {"name": "answer", "schema": {"type": "object"}}
        rids.append(
            client.chat.completions.create(
                model=model, messages=ask, max_tokens=4, response_format={"type": "json_schema", "json_schema": schema},
                logprobs=True, top_logprobs=2,
            ).id
        )  # fmt: skip
        client.close()
        return rids

    first, second, structured = await trio.to_thread.run_sync(use_client)
    engine_rids = [rid.removeprefix("chatcmpl-") + "0000" for rid in (first, second, structured)]
    assert await served_by(engines, engine_rids[0]) == await served_by(engines, engine_rids[1])
    [seen] = [
        a["requests"][engine_rids[2]]
        for e in engines
        if engine_rids[2] in (a := await engine_accounting(e.url))["requests"]
    ]
    assert (seen["constraint"], seen["logprobs"]) == ("json_schema", 2)

    # 50 streams cut at random points: every engine ends idle, every cut request got its Abort.
    talk = [{"role": "user", "content": "Talk"}]
    body = {"model": "trio-direct-mock", "messages": talk, "max_tokens": 1000, "ignore_eos": True}

    async def hang_up(keep: int) -> None:
        async with aclosing(RawSseClient(base).events("/v1/chat/completions", body | {"stream": True})) as events:
            seen = 0
            async for _ in events:
                seen += 1
                if seen > keep:
                    return

    async with trio.open_nursery() as clients:
        for i in range(50):
            clients.start_soon(hang_up, 1 + i % 7)
    accounts = await settled_accounts([e.url for e in engines])
    cut = {rid for a in accounts for rid, outcome in a["outcomes"].items() if outcome in ("cancelled", "aborted")}
    aborts = [rid for a in accounts for rid, _ in a["abort_rpcs"]]
    assert len(cut) == 50 and cut <= set(aborts) and len(aborts) == len(set(aborts))
    assert all(not a["live"] for a in accounts)


async def test_a_frontend_without_the_tokenizer_files_loads_them_from_the_engine(
    aio_loop, nursery, tmp_path, tiny_model, monkeypatch
):
    """The engine reports a tokenizer path only it can read (relative to its own directory)."""
    engine_dir = tmp_path / "engine"
    shutil.copytree(tiny_model, engine_dir / "model")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    command = [sys.executable, "-m", "trio_direct", "mock-engine", "--port", "0", "--api", "vllm"]
    command += ["--speedup", "inf", "--model-path", "model"]
    run = partial(trio.run_process, command, cwd=engine_dir, stdout=subprocess.PIPE, check=False)
    process = await nursery.start(run)
    line = b""
    with trio.fail_after(30):
        while not line.endswith(b"\n"):
            line += await process.stdout.receive_some(1)
    ready = json.loads(line)
    base = await start_frontend(nursery, "--engine-url", f"grpc://{ready['host']}:{ready['port']}")
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        body = {"model": "trio-direct-mock", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}
        reply = await client.post("/v1/chat/completions", json=body)
    assert reply.status_code == 200 and reply.json()["usage"]["prompt_tokens"] > 0
