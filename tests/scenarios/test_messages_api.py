"""`/v1/messages` through `trio-direct serve` over two mock engines, with the official `anthropic`
SDK: `messages.create`, `messages.stream`, a tool round trip, thinking blocks, stop sequences and
`count_tokens`; aggregated and prefill/decode. `x-api-key` authenticates; a client that leaves a
stream gets its engine request aborted; bad requests get Anthropic errors, never a 5xx."""

from __future__ import annotations

import json
from contextlib import aclosing

import anthropic
import httpx
import pytest
import trio
from anthropic.types import (
    MessageParam,
    TextBlock,
    ThinkingBlock,
    ToolParam,
    ToolResultBlockParam,
    ToolUseBlock,
)
from anthropic.types.message_create_params import MessageCreateParamsNonStreaming
from support import RawSseClient
from surface_scenarios import MODES, aborted, generations, settle, start_fleet

pytestmark = pytest.mark.slow

TOOLS: list[ToolParam] = [
    {
        "name": "get_weather",
        "description": "Current weather in a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    }
]


def sdk(base: str, api_key: str = "unused") -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=base, api_key=api_key, max_retries=0)


@pytest.mark.parametrize("mode", MODES)
async def test_messages_with_the_anthropic_sdk(aio_loop, nursery, tmp_path, mode):
    fleet = await start_fleet(nursery, tmp_path, mode)
    model = fleet.model

    def use_client() -> None:
        client = sdk(fleet.base)
        riddle: list[MessageParam] = [{"role": "user", "content": "Tell me the riddle answer"}]

        # thinking blocks from the reasoning parser, then the text
        reply = client.messages.create(model=model, max_tokens=100, messages=riddle, thinking={"type": "adaptive"})
        assert reply.id.startswith("msg_") and reply.stop_reason == "end_turn"
        thinking, text = reply.content
        assert isinstance(thinking, ThinkingBlock) and isinstance(text, TextBlock)
        assert (thinking.type, thinking.thinking) == ("thinking", "Keys but no locks... a piano.")
        assert (text.type, text.text) == ("text", "A piano.")
        usage = reply.usage
        assert usage.cache_read_input_tokens is not None
        assert usage.input_tokens >= 0 and usage.output_tokens > 0 and usage.cache_read_input_tokens >= 0

        # the same prompt counted: exactly the tokens the request sent
        counted = client.messages.count_tokens(model=model, messages=riddle, thinking={"type": "adaptive"})
        assert counted.input_tokens == usage.input_tokens + usage.cache_read_input_tokens

        # streamed: the SDK's accumulator gets the same message
        with client.messages.stream(model=model, max_tokens=100, messages=riddle) as stream:
            streamed_text = "".join(stream.text_stream)
            final = stream.get_final_message()
        assert streamed_text == "A piano."
        assert [block.type for block in final.content] == ["thinking", "text"] and final.stop_reason == "end_turn"

        # a tool round trip: tool_use, then the tool_result answered
        ask: list[MessageParam] = [{"role": "user", "content": "What is the weather in Paris?"}]
        first = client.messages.create(model=model, max_tokens=200, messages=ask, tools=TOOLS)
        assert first.stop_reason == "tool_use"
        call = first.content[-1]
        assert isinstance(call, ToolUseBlock)
        assert (call.type, call.name, call.input) == ("tool_use", "get_weather", {"city": "Paris"})
        result: ToolResultBlockParam = {"type": "tool_result", "tool_use_id": call.id, "content": "22C"}
        turns: list[MessageParam] = [
            *ask,
            {"role": "assistant", "content": first.content},
            {"role": "user", "content": [result]},
        ]
        second = client.messages.create(model=model, max_tokens=200, messages=turns, tools=TOOLS)
        answer = second.content[-1]
        assert isinstance(answer, TextBlock)
        assert (second.stop_reason, answer.text) == ("end_turn", "It is 22C and sunny in Paris.")
        with client.messages.stream(model=model, max_tokens=200, messages=ask, tools=TOOLS) as stream:
            streamed = stream.get_final_message()
        streamed_call = streamed.content[-1]
        assert isinstance(streamed_call, ToolUseBlock)
        assert streamed.stop_reason == "tool_use" and streamed_call.input == {"city": "Paris"}

        # stop sequences
        counting: list[MessageParam] = [{"role": "user", "content": "Count for me"}]
        stopped = client.messages.create(model=model, max_tokens=50, messages=counting, stop_sequences=["STOP"])
        assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", "STOP")
        stopped_text = stopped.content[0]
        assert isinstance(stopped_text, TextBlock) and stopped_text.text == "one two three "
        capped = client.messages.create(model=model, max_tokens=2, messages=counting)
        assert capped.stop_reason == "max_tokens" and capped.usage.output_tokens == 2
        client.close()

    await trio.to_thread.run_sync(use_client)
    for account in await settle(fleet):  # nothing left running; a request cut at a stop string may end in an Abort
        assert account["started"] == account["finished"] + account["aborted"] + account["cancelled"]
    async with httpx.AsyncClient(base_url=fleet.base, timeout=30) as client:
        scraped = (await client.get("/metrics")).text
    for stream in ("true", "false"):  # the route's endpoint label is all it takes to be counted
        assert f'endpoint="messages",model="{fleet.model}",status="200",stream="{stream}"' in scraped


async def test_x_api_key_and_bearer_both_authenticate_messages(aio_loop, nursery, tmp_path):
    fleet = await start_fleet(nursery, tmp_path, "aggregated", api_key="sesame")
    body: MessageCreateParamsNonStreaming = {
        "model": fleet.model,
        "max_tokens": 4,
        "messages": [{"role": "user", "content": "Hello"}],
    }

    def use_client() -> None:
        with sdk(fleet.base, "sesame") as client:  # the SDK sends x-api-key
            assert client.messages.create(**body).type == "message"
            assert client.messages.count_tokens(model=fleet.model, messages=body["messages"]).input_tokens > 0
        with sdk(fleet.base, "wrong") as client, pytest.raises(anthropic.AuthenticationError) as refused:
            client.messages.create(**body)
        assert refused.value.body == {
            "type": "error",
            "error": {"type": "authentication_error", "message": "Incorrect API key provided."},
        }

    await trio.to_thread.run_sync(use_client)
    async with httpx.AsyncClient(base_url=fleet.base, timeout=30) as client:
        bearer = await client.post("/v1/messages", json=body, headers={"authorization": "Bearer sesame"})
        assert bearer.status_code == 200
        # x-api-key is the Messages routes' header only
        chat = {"model": fleet.model, "messages": body["messages"], "max_tokens": 4}
        other = await client.post("/v1/chat/completions", json=chat, headers={"x-api-key": "sesame"})
        assert other.status_code == 401 and other.json()["error"]["type"] == "authentication_error"


@pytest.mark.parametrize("mode", MODES)
async def test_a_client_that_leaves_a_messages_stream_gets_its_engine_request_aborted(
    aio_loop, nursery, tmp_path, mode
):
    fleet = await start_fleet(nursery, tmp_path, mode, speedup="1")
    body = {
        "model": fleet.model,
        "max_tokens": 300,
        "messages": [{"role": "user", "content": "Tell me a long story"}],
        "stream": True,
        "ignore_eos": True,  # SGLang's extension: the sampled story never ends before the client leaves
    }
    for _ in range(3):
        seen = []
        async with aclosing(RawSseClient(fleet.base).events("/v1/messages", body)) as events:
            async for event in events:
                seen.append(event)
                if len(seen) == 8:
                    break  # and hang up mid-stream
        assert [event["type"] for event in seen[:3]] == ["message_start", "ping", "content_block_start"]
    accounts = await settle(fleet)
    decoding = accounts[1:] if mode.endswith("disaggregated") else accounts
    cut = [rid for account in decoding for rid in aborted(account)]
    assert len(cut) == len(set(cut)) == 3  # one Abort per request, each still running when the client left
    assert {rid for account in decoding for rid in generations(account)} == set(cut)
    for account in accounts:
        assert account["started"] == account["finished"] + account["aborted"] + account["cancelled"] + account["failed"]


MODEL = "{model}"  # filled in from /v1/models
HELLO = [{"role": "user", "content": "Hello"}]
MESSAGES = "/v1/messages"

#: (name, path, body, status, Anthropic error type)
BAD = [
    ("malformed JSON", MESSAGES, b"{nope", 400, "invalid_request_error"),
    ("body is a list", MESSAGES, b"[1]", 400, "invalid_request_error"),
    ("missing max_tokens", MESSAGES, {"model": MODEL, "messages": HELLO}, 400, "invalid_request_error"),
    ("missing messages", MESSAGES, {"model": MODEL, "max_tokens": 5}, 400, "invalid_request_error"),
    ("empty messages", MESSAGES, {"model": MODEL, "max_tokens": 5, "messages": []}, 400, "invalid_request_error"),
    (
        "unknown role",
        MESSAGES,
        {"model": MODEL, "max_tokens": 5, "messages": [{"role": "boss", "content": "x"}]},
        400,
        "invalid_request_error",
    ),
    (
        "image block",
        MESSAGES,
        {
            "model": MODEL,
            "max_tokens": 5,
            "messages": [
                {"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "http://x/y.png"}}]}
            ],
        },
        400,
        "invalid_request_error",
    ),
    ("max_tokens zero", MESSAGES, {"model": MODEL, "max_tokens": 0, "messages": HELLO}, 400, "invalid_request_error"),
    (
        "temperature over one",
        MESSAGES,
        {"model": MODEL, "max_tokens": 5, "messages": HELLO, "temperature": 1.5},
        400,
        "invalid_request_error",
    ),
    (
        "server tool",
        MESSAGES,
        {
            "model": MODEL,
            "max_tokens": 5,
            "messages": HELLO,
            "tools": [{"type": "web_search_20250305", "name": "web_search"}],
        },
        400,
        "invalid_request_error",
    ),
    (
        "tool choice without the tool",
        MESSAGES,
        {
            "model": MODEL,
            "max_tokens": 5,
            "messages": HELLO,
            "tools": TOOLS,
            "tool_choice": {"type": "tool", "name": "nope"},
        },
        400,
        "invalid_request_error",
    ),
    (
        "thinking budget too small",
        MESSAGES,
        {"model": MODEL, "max_tokens": 5000, "messages": HELLO, "thinking": {"type": "enabled", "budget_tokens": 10}},
        400,
        "invalid_request_error",
    ),
    (
        "bad extension",
        MESSAGES,
        {"model": MODEL, "max_tokens": 5, "messages": HELLO, "min_tokens": 9},
        400,
        "invalid_request_error",
    ),
    ("unknown model", MESSAGES, {"model": "claude-9", "max_tokens": 5, "messages": HELLO}, 404, "not_found_error"),
    (
        "prompt too long",
        MESSAGES,
        {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "word " * 34000}]},
        400,
        "invalid_request_error",
    ),
    (
        "body too large",
        MESSAGES,
        {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "x" * 300_000}]},
        413,
        "request_too_large",
    ),
    ("count_tokens without messages", "/v1/messages/count_tokens", {"model": MODEL}, 400, "invalid_request_error"),
    (
        "count_tokens unknown model",
        "/v1/messages/count_tokens",
        {"model": "claude-9", "messages": HELLO},
        404,
        "not_found_error",
    ),
]


async def test_bad_messages_requests_get_anthropic_errors(aio_loop, nursery, tmp_path):
    fleet = await start_fleet(nursery, tmp_path, "aggregated", "--max-body-bytes", "200000")
    failures = []
    async with httpx.AsyncClient(base_url=fleet.base, timeout=30) as client:
        for name, path, body, status, kind in BAD:
            content = body if isinstance(body, bytes) else json.dumps(body).replace(MODEL, fleet.model).encode()
            with trio.fail_after(10):
                response = await client.post(path, content=content, headers={"content-type": "application/json"})
            try:
                payload = response.json()
                assert response.status_code == status, (response.status_code, payload)
                assert payload["type"] == "error" and set(payload) == {"type", "error"}
                assert payload["error"]["type"] == kind and payload["error"]["message"], payload
            except (AssertionError, ValueError, KeyError) as failure:
                failures.append(f"{name}: {failure!r} / {response.status_code} {response.text[:200]}")
        ok = await client.post(MESSAGES, json={"model": fleet.model, "max_tokens": 2, "messages": HELLO})
        assert ok.status_code == 200
    assert not failures, "\n".join(failures)
