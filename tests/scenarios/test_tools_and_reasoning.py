"""Tool calls and reasoning through the frontend, read with the official OpenAI client.

The mock engine answers chosen prompts with scripted text (`--scripted-outputs`), standing in for a
Qwen3-style model that thinks in `<think>` tags and calls tools in Hermes `<tool_call>` markup.
"""

from __future__ import annotations

import json

import pytest
import trio
from openai.types.chat import (
    ChatCompletionFunctionToolParam,
    ChatCompletionMessageFunctionToolCall,
    ChatCompletionMessageParam,
)
from support import start_frontend, start_mock_engine

pytestmark = pytest.mark.slow

SCRIPTS = [
    {
        "match": "weather",
        "text": "<think>The user wants the weather in Paris.</think>Let me check.<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>',
    },
    {"match": "riddle", "text": "<think>Keys but no locks... a piano.</think>A piano."},
    {"match": "Rome", "text": '{"city": "Rome"}'},
    {"match": "Oslo", "text": '[{"name": "get_weather", "parameters": {"city": "Oslo"}}]'},
]
TOOLS: list[ChatCompletionFunctionToolParam] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]


@pytest.fixture
async def base(aio_loop, nursery, tmp_path):
    script = tmp_path / "scripts.json"
    script.write_text(json.dumps(SCRIPTS))
    engine = await start_mock_engine(
        nursery, "--speedup", "inf", "--incremental-streaming-output", "--scripted-outputs", str(script)
    )
    return await start_frontend(
        nursery, "--engine-url", engine.url, "--reasoning-parser", "qwen3", "--tool-call-parser", "hermes"
    )


async def test_tool_calls_and_reasoning_unary_and_streamed(base):
    import openai

    def use_client() -> None:
        client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
        model = client.models.list().data[0].id
        ask: list[ChatCompletionMessageParam] = [{"role": "user", "content": "What is the weather in Paris?"}]
        reply = client.chat.completions.create(model=model, messages=ask, tools=TOOLS, max_tokens=200)
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls"
        assert choice.message.content == "Let me check."
        assert choice.message.model_extra is not None
        assert choice.message.model_extra["reasoning_content"] == "The user wants the weather in Paris."
        assert choice.message.tool_calls is not None
        (call,) = choice.message.tool_calls
        assert isinstance(call, ChatCompletionMessageFunctionToolCall)
        assert call.function.name == "get_weather" and call.id.startswith("call_")
        assert json.loads(call.function.arguments) == {"city": "Paris", "unit": "celsius"}

        stream = client.chat.completions.create(model=model, messages=ask, tools=TOOLS, max_tokens=200, stream=True)
        content, reasoning, names, arguments, finish = [], [], [], [], None
        for chunk in stream:
            if not chunk.choices:
                continue
            delta = chunk.choices[0].delta
            content.append(delta.content or "")
            reasoning.append((delta.model_extra or {}).get("reasoning_content") or "")
            for delta_call in delta.tool_calls or ():
                assert delta_call.function is not None
                if delta_call.function.name:
                    names.append(delta_call.function.name)
                arguments.append(delta_call.function.arguments or "")
            finish = chunk.choices[0].finish_reason or finish
        assert "".join(content) == "Let me check." and "<tool_call>" not in "".join(content)
        assert "".join(reasoning) == "The user wants the weather in Paris."
        assert names == ["get_weather"] and json.loads("".join(arguments)) == {"city": "Paris", "unit": "celsius"}
        assert finish == "tool_calls"

        plain = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Tell me the riddle answer"}], max_tokens=200
        )
        assert plain.choices[0].finish_reason == "stop"
        assert plain.choices[0].message.content == "A piano."
        assert plain.choices[0].message.model_extra is not None
        assert plain.choices[0].message.model_extra["reasoning_content"] == "Keys but no locks... a piano."
        raw = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "Tell me the riddle answer"}],
            max_tokens=200,
            extra_body={"separate_reasoning": False},
        )
        raw_content = raw.choices[0].message.content
        assert raw_content is not None and raw_content.startswith("<think>")
        client.close()

    await trio.to_thread.run_sync(use_client)


async def test_forced_tool_choice_gives_tool_calls(base):
    import openai

    def use_client() -> None:
        client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
        model = client.models.list().data[0].id
        named = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "Weather in Rome?"}],
            tools=TOOLS,
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
            max_tokens=100,
        )
        assert named.choices[0].message.tool_calls is not None
        (call,) = named.choices[0].message.tool_calls
        assert isinstance(call, ChatCompletionMessageFunctionToolCall)
        assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", {"city": "Rome"})
        required = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "Weather in Oslo?"}],
            tools=TOOLS,
            tool_choice="required",
            max_tokens=100,
            stream=True,
        )
        calls = [c for chunk in required if chunk.choices for c in chunk.choices[0].delta.tool_calls or ()]
        (only,) = calls
        assert only.function is not None and only.function.arguments is not None
        assert only.function.name == "get_weather"
        assert json.loads(only.function.arguments) == {"city": "Oslo"}
        client.close()

    await trio.to_thread.run_sync(use_client)


def test_forced_tool_choices_become_guided_decoding_schemas():
    from trio_direct.openai.requests import ChatCompletionRequest, decode_chat_request
    from trio_direct.openai.tool_choice import tool_choice_schema

    def request(tool_choice) -> ChatCompletionRequest:
        body = {
            "model": "m",
            "messages": [{"role": "user", "content": "x"}],
            "tools": TOOLS,
            "tool_choice": tool_choice,
        }
        return decode_chat_request(json.dumps(body).encode())

    assert tool_choice_schema(request("auto")) is None
    named_schema = tool_choice_schema(request({"type": "function", "function": {"name": "get_weather"}}))
    assert named_schema is not None
    named = json.loads(named_schema)
    assert named == TOOLS[0]["function"]["parameters"]
    required_schema = tool_choice_schema(request("required"))
    assert required_schema is not None
    required = json.loads(required_schema)
    assert required["type"] == "array" and required["minItems"] == 1
    (option,) = required["items"]["anyOf"]
    assert option["properties"]["name"] == {"type": "string", "enum": ["get_weather"]}


async def test_an_unknown_parser_name_stops_start_up(aio_loop, nursery):
    from trio_direct.fleet.fleet import FleetError

    engine = await start_mock_engine(nursery, "--speedup", "inf")
    with pytest.RaisesGroup(
        pytest.RaisesExc(FleetError, match="unknown tool-call parser 'nope'.*hermes"), flatten_subgroups=True
    ):
        async with trio.open_nursery() as inner:
            await start_frontend(inner, "--engine-url", engine.url, "--tool-call-parser", "nope")
