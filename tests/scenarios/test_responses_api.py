"""`/v1/responses` through `trio-direct serve` over two mock engines, with the official `openai` SDK:
plain, streamed, a function tool round trip, `previous_response_id`, GET and DELETE; aggregated and
prefill/decode. A client that leaves a stream gets its engine request aborted; bad requests get
OpenAI errors."""

from __future__ import annotations

import json
from contextlib import aclosing

import httpx
import openai
import pytest
import trio
from openai.types.responses import (
    FunctionToolParam,
    ResponseFunctionCallArgumentsDeltaEvent,
    ResponseFunctionToolCall,
    ResponseReasoningItem,
)
from openai.types.responses.response_input_param import FunctionCallOutput
from support import RawSseClient
from surface_scenarios import MODES, aborted, generations, settle, start_fleet

pytestmark = pytest.mark.slow

MODEL = "{model}"  # filled in from /v1/models
TOOLS: list[FunctionToolParam] = [
    {  # type: ignore[typeddict-item]  # "strict" left out on purpose: the API defaults it, the SDK marks it Required
        "type": "function",
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    }
]


@pytest.mark.parametrize("mode", MODES)
async def test_responses_with_the_openai_sdk(aio_loop, nursery, tmp_path, mode):
    fleet = await start_fleet(nursery, tmp_path, mode)

    def use_client() -> None:
        client = openai.OpenAI(base_url=fleet.base + "/v1", api_key="unused", max_retries=0)

        # plain: reasoning and a message, usage with the prompt's cached tokens
        plain = client.responses.create(model=fleet.model, input="Tell me the riddle answer", max_output_tokens=100)
        assert plain.status == "completed" and plain.id.startswith("resp_")
        assert [item.type for item in plain.output] == ["reasoning", "message"]
        reasoning = plain.output[0]
        assert isinstance(reasoning, ResponseReasoningItem) and reasoning.content is not None
        assert reasoning.content[0].text == "Keys but no locks... a piano."
        assert plain.output_text == "A piano."
        assert plain.usage is not None
        assert plain.usage.input_tokens > 0 and plain.usage.output_tokens > 0
        assert plain.usage.input_tokens_details.cached_tokens >= 0

        # streamed: the event sequence, then the SDK's own assembly of it
        events = list(client.responses.create(model=fleet.model, input="Tell me the riddle answer", stream=True))
        assert [e.type for e in events[:2]] == ["response.created", "response.in_progress"]
        assert events[-1].type == "response.completed"
        assert [e.sequence_number for e in events] == list(range(len(events)))
        assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "A piano."
        with client.responses.stream(model=fleet.model, input="Tell me the riddle answer") as stream:
            assert stream.get_final_response().output_text == "A piano."

        # a function tool, and its output fed back: through previous_response_id, and as items
        ask = "What is the weather in Paris?"
        first = client.responses.create(model=fleet.model, input=ask, tools=TOOLS)
        call = first.output[-1]
        assert [item.type for item in first.output] == ["reasoning", "message", "function_call"]
        assert isinstance(call, ResponseFunctionToolCall)
        assert (call.name, json.loads(call.arguments)) == ("get_weather", {"city": "Paris"})
        result: FunctionCallOutput = {"type": "function_call_output", "call_id": call.call_id, "output": "22C"}
        chained = client.responses.create(model=fleet.model, previous_response_id=first.id, input=[result], tools=TOOLS)
        assert chained.output_text == "It is 22C and sunny in Paris."
        assert chained.previous_response_id == first.id
        replayed = client.responses.create(
            model=fleet.model,
            input=[{"role": "user", "content": ask}, *first.output, result],  # type: ignore[list-item]  # the SDK sends its own output items back as input; its types take only *Param dicts
            tools=TOOLS,
            store=False,
        )
        assert replayed.output_text == "It is 22C and sunny in Paris."
        streamed_call = [
            e for e in client.responses.create(model=fleet.model, input=ask, tools=TOOLS, stream=True)
            if isinstance(e, ResponseFunctionCallArgumentsDeltaEvent)
        ]  # fmt: skip
        assert json.loads("".join(e.delta for e in streamed_call)) == {"city": "Paris"}

        # previous_response_id continues the conversation; the store answers GET and DELETE
        told = client.responses.create(model=fleet.model, input="My name is Ada. Please remember it.")
        assert told.output_text == "I will remember, Ada."
        again = client.responses.create(model=fleet.model, previous_response_id=told.id, input="What is my name?")
        assert again.output_text == "Your name is Ada."
        assert again.usage is not None and told.usage is not None
        assert again.usage.input_tokens > told.usage.input_tokens
        assert client.responses.retrieve(told.id).model_dump() == told.model_dump()
        client.responses.delete(told.id)
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(told.id)
        with pytest.raises(openai.NotFoundError):
            client.responses.create(model=fleet.model, previous_response_id=told.id, input="And now?")
        with pytest.raises(openai.NotFoundError):
            client.responses.delete(told.id)
        unstored = client.responses.create(model=fleet.model, input="Tell me the riddle answer", store=False)
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(unstored.id)
        client.close()

    await trio.to_thread.run_sync(use_client)
    for account in await settle(fleet):  # nothing left running; a request cut at a stop string may end in an Abort
        assert account["started"] == account["finished"] + account["aborted"] + account["cancelled"]
    async with httpx.AsyncClient(base_url=fleet.base, timeout=30) as client:
        scraped = (await client.get("/metrics")).text
    for stream in ("true", "false"):  # the route's endpoint label is all it takes to be counted
        assert f'endpoint="responses",model="{fleet.model}",status="200",stream="{stream}"' in scraped


@pytest.mark.parametrize("mode", MODES)
async def test_a_client_that_leaves_a_responses_stream_gets_its_engine_request_aborted(
    aio_loop, nursery, tmp_path, mode
):
    fleet = await start_fleet(nursery, tmp_path, mode, speedup="1")
    # ignore_eos (SGLang's extension): the sampled story never ends before the client leaves
    body = {
        "model": fleet.model,
        "input": "Tell me a long story",
        "max_output_tokens": 300,
        "stream": True,
        "ignore_eos": True,
    }
    for _ in range(3):
        seen = []
        async with aclosing(RawSseClient(fleet.base).events("/v1/responses", body)) as events:
            async for event in events:
                seen.append(event)
                if len(seen) == 8:
                    break  # and hang up mid-stream
        assert [event["type"] for event in seen[:3]] == [
            "response.created", "response.in_progress", "response.output_item.added"
        ]  # fmt: skip
    accounts = await settle(fleet)
    decoding = accounts[1:] if mode.endswith("disaggregated") else accounts
    cut = [rid for account in decoding for rid in aborted(account)]
    assert len(cut) == len(set(cut)) == 3  # one Abort per request, each still running when the client left
    assert {rid for account in decoding for rid in generations(account)} == set(cut)
    for account in accounts:
        assert account["started"] == account["finished"] + account["aborted"] + account["cancelled"] + account["failed"]


HELLO = "Hello"

#: (name, method, path, body, status, param or None)
BAD = [
    ("malformed JSON", "POST", "/v1/responses", b"{nope", 400, None),
    ("missing input", "POST", "/v1/responses", {"model": MODEL}, 400, "input"),
    ("missing model", "POST", "/v1/responses", {"input": HELLO}, 400, "model"),
    ("unknown model", "POST", "/v1/responses", {"model": "gpt-17", "input": HELLO}, 404, "model"),
    (
        "hosted tool",
        "POST",
        "/v1/responses",
        {"model": MODEL, "input": HELLO, "tools": [{"type": "web_search"}]},
        400,
        "tools[0].type",
    ),
    (
        "image input",
        "POST",
        "/v1/responses",
        {
            "model": MODEL,
            "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}],
        },
        400,
        "input[0].content[0]",  # the mocks report no image support
    ),
    (
        "unknown item",
        "POST",
        "/v1/responses",
        {"model": MODEL, "input": [{"type": "computer_call_output", "call_id": "c"}]},
        400,
        "input[0].type",
    ),
    (
        "output for no call",
        "POST",
        "/v1/responses",
        {"model": MODEL, "input": [{"type": "function_call_output", "call_id": "c", "output": "x"}]},
        400,
        "input[0].call_id",
    ),
    ("background", "POST", "/v1/responses", {"model": MODEL, "input": HELLO, "background": True}, 400, "background"),
    (
        "max_output_tokens zero",
        "POST",
        "/v1/responses",
        {"model": MODEL, "input": HELLO, "max_output_tokens": 0},
        400,
        "max_output_tokens",
    ),
    (
        "temperature too high",
        "POST",
        "/v1/responses",
        {"model": MODEL, "input": HELLO, "temperature": 9},
        400,
        "temperature",
    ),
    (
        "named tool not offered",
        "POST",
        "/v1/responses",
        {"model": MODEL, "input": HELLO, "tools": TOOLS, "tool_choice": {"type": "function", "name": "nope"}},
        400,
        "tool_choice",
    ),
    (
        "two constraints",
        "POST",
        "/v1/responses",
        {"model": MODEL, "input": HELLO, "regex": "a+", "text": {"format": {"type": "json_object"}}},
        400,
        None,
    ),
    (
        "min_tokens over max",
        "POST",
        "/v1/responses",
        {"model": MODEL, "input": HELLO, "min_tokens": 9, "max_output_tokens": 3},
        400,
        "min_tokens",
    ),
    (
        "unknown previous response",
        "POST",
        "/v1/responses",
        {"model": MODEL, "input": HELLO, "previous_response_id": "resp_nope"},
        404,
        "previous_response_id",
    ),
    ("prompt too long", "POST", "/v1/responses", {"model": MODEL, "input": "word " * 40000}, 400, "input"),
    ("get unknown", "GET", "/v1/responses/resp_nope", None, 404, None),
    ("delete unknown", "DELETE", "/v1/responses/resp_nope", None, 404, None),
    ("wrong method", "PUT", "/v1/responses", None, 405, None),
]


async def test_bad_responses_requests_get_openai_errors(aio_loop, nursery, tmp_path):
    fleet = await start_fleet(nursery, tmp_path, "aggregated")
    failures = []
    async with httpx.AsyncClient(base_url=fleet.base, timeout=30) as client:
        for name, method, path, body, status, param in BAD:
            content = (
                body
                if isinstance(body, bytes) or body is None
                else json.dumps(body).replace(MODEL, fleet.model).encode()
            )
            with trio.fail_after(10):
                response = await client.request(
                    method, path, content=content, headers={"content-type": "application/json"}
                )
            try:
                error = response.json()["error"]
                assert response.status_code == status, (response.status_code, error)
                assert set(error) == {"message", "type", "param", "code"} and error["message"]
                if param is not None:
                    assert error["param"] == param, error
            except (AssertionError, ValueError, KeyError) as failure:
                failures.append(f"{name}: {failure!r} / {response.status_code} {response.text[:200]}")
        ok = await client.post("/v1/responses", json={"model": fleet.model, "input": HELLO, "max_output_tokens": 2})
        assert ok.status_code == 200
    assert not failures, "\n".join(failures)
