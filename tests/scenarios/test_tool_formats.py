"""One model output per tool-call family through `trio-direct serve`, read with the OpenAI SDK.

The mock engine answers with a scripted text in the family's real markup (reasoning, a line for
the user, then two calls); the frontend runs with that format's `--tool-call-parser` and
`--reasoning-parser`. Unary and streamed answers must agree: same content, reasoning and calls.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
import trio
from openai.types.chat import (
    ChatCompletionFunctionToolParam,
    ChatCompletionMessageFunctionToolCall,
    ChatCompletionMessageParam,
)
from support import start_frontend, start_mock_engine

pytestmark = pytest.mark.slow

D = "\uff5cDSML\uff5c"
TOOLS: list[ChatCompletionFunctionToolParam] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {"name": "get_time", "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}}},
    },
]
CALLS = [("get_weather", {"city": "Paris", "days": 3}), ("get_time", {"tz": "CET"})]


@dataclass(frozen=True)
class Family:
    id: str
    tool_call_parser: str
    reasoning_parser: str | None
    text: str
    reasoning: str | None = "Two lookups."
    content: str = "Checking both."


FAMILIES = [
    Family(
        "json-objects-cohere",
        "cohere",
        "cohere_cmd",
        "<|START_THINKING|>Two lookups.<|END_THINKING|><|START_RESPONSE|>Checking both.<|END_RESPONSE|>"
        '<|START_ACTION|>[{"tool_call_id": "0", "tool_name": "get_weather", "parameters": {"city": "Paris", '
        '"days": 3}}, {"tool_call_id": "1", "tool_name": "get_time", "parameters": {"tz": "CET"}}]<|END_ACTION|>',
    ),
    Family(
        "tag-per-argument-glm47",
        "glm47_moe",
        "glm45",
        "<think>Two lookups.</think>Checking both.<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris"
        "</arg_value><arg_key>days</arg_key><arg_value>3</arg_value></tool_call><tool_call>get_time"
        "<arg_key>tz</arg_key><arg_value>CET</arg_value></tool_call>",
    ),
    Family(
        "invoke-elements-deepseek-v32",
        "deepseek32",
        "deepseek_v31",
        f'<think>Two lookups.</think>Checking both.\n\n<{D}function_calls>\n<{D}invoke name="get_weather">\n'
        f'<{D}parameter name="city" string="true">Paris</{D}parameter>\n<{D}parameter name="days" '
        f'string="false">3</{D}parameter>\n</{D}invoke>\n<{D}invoke name="get_time">\n<{D}parameter name="tz" '
        f'string="true">CET</{D}parameter>\n</{D}invoke>\n</{D}function_calls>',
    ),
    Family(
        "invoke-elements-minimax-m2",
        "minimax_m2",
        "minimax",
        'Two lookups.</think>Checking both.\n<minimax:tool_call>\n<invoke name="get_weather">\n'
        '<parameter name="city">Paris</parameter>\n<parameter name="days">3</parameter>\n</invoke>\n'
        '<invoke name="get_time">\n<parameter name="tz">CET</parameter>\n</invoke>\n</minimax:tool_call>',
    ),
    Family(
        "special-token-sections-kimi-k2",
        "kimik2",
        "kimi_k25",
        "<think>Two lookups.</think>Checking both.<|tool_calls_section_begin|><|tool_call_begin|>"
        'functions.get_weather:0<|tool_call_argument_begin|>{"city": "Paris", "days": 3}<|tool_call_end|>'
        '<|tool_call_begin|>functions.get_time:1<|tool_call_argument_begin|>{"tz": "CET"}<|tool_call_end|>'
        "<|tool_calls_section_end|>",
    ),
    Family(
        "xtml-kimi-k3",
        "kimi_k3",
        "kimi_k3",
        "<|open|>think<|sep|>Two lookups.<|close|>think<|sep|><|open|>response<|sep|>Checking both."
        '<|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool="get_weather" index="1"<|sep|>'
        '<|open|>argument key="city" type="string"<|sep|>Paris<|close|>argument<|sep|><|open|>argument '
        'key="days" type="integer"<|sep|>3<|close|>argument<|sep|><|close|>call<|sep|><|open|>call '
        'tool="get_time" index="2"<|sep|><|open|>argument key="tz" type="string"<|sep|>CET<|close|>argument'
        "<|sep|><|close|>call<|sep|><|close|>tools<|sep|>",
    ),
    Family(
        "pythonic-llama4",
        "pythonic",
        None,
        'Checking both.<|python_start|>[get_weather(city="Paris", days=3), get_time(tz="CET")]<|python_end|>',
        reasoning=None,
    ),
    Family(
        "python-dicts-sarashina",
        "sarashina",
        None,
        "Checking both.<|tool_calls|>[{'name': 'get_weather', 'arguments': {'city': 'Paris', 'days': 3}}, "
        "{'name': 'get_time', 'arguments': {'tz': 'CET'}}]",
        reasoning=None,
    ),
    # Harmony markers are plain text to the mock's tokenizer: the parsers read them all the same.
    Family(
        "harmony-gpt-oss",
        "gpt-oss",
        "gpt-oss",
        "<|channel|>analysis<|message|>Two lookups.<|end|><|start|>assistant<|channel|>commentary<|message|>"
        "Checking both.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
        '<|message|>{"city": "Paris", "days": 3}<|call|><|start|>assistant<|channel|>commentary '
        'to=functions.get_time <|constrain|>json<|message|>{"tz": "CET"}',
    ),
]


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.id)
async def test_a_tool_call_family_through_the_openai_sdk(aio_loop, nursery, tmp_path, family: Family):
    import openai

    script = tmp_path / "scripts.json"
    script.write_text(json.dumps([{"match": None, "text": family.text}]))
    engine = await start_mock_engine(
        nursery, "--speedup", "inf", "--incremental-streaming-output", "--scripted-outputs", str(script)
    )
    flags = ["--tool-call-parser", family.tool_call_parser]
    if family.reasoning_parser:
        flags += ["--reasoning-parser", family.reasoning_parser]
    base = await start_frontend(nursery, "--engine-url", engine.url, *flags)

    def use_client() -> None:
        client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
        model = client.models.list().data[0].id
        ask: list[ChatCompletionMessageParam] = [
            {"role": "user", "content": "Weather in Paris for 3 days, and the time in CET?"}
        ]
        reply = client.chat.completions.create(model=model, messages=ask, tools=TOOLS, max_tokens=1000)
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls"
        assert choice.message.content == family.content
        assert (choice.message.model_extra or {}).get("reasoning_content") == family.reasoning
        calls = choice.message.tool_calls or []
        function_calls = [c for c in calls if isinstance(c, ChatCompletionMessageFunctionToolCall)]
        assert function_calls == calls
        assert [(c.function.name, json.loads(c.function.arguments)) for c in function_calls] == CALLS
        assert len({c.id for c in calls}) == 2

        stream = client.chat.completions.create(model=model, messages=ask, tools=TOOLS, max_tokens=1000, stream=True)
        content, reasoning, finish = [], [], None
        names: dict[int, str] = {}
        arguments: dict[int, list[str]] = {}
        for chunk in stream:
            if not chunk.choices:
                continue
            delta = chunk.choices[0].delta
            content.append(delta.content or "")
            reasoning.append((delta.model_extra or {}).get("reasoning_content") or "")
            for call in delta.tool_calls or ():
                assert call.function is not None
                if call.function.name:
                    assert call.index not in names and call.id, "id and name come once, first"
                    names[call.index] = call.function.name
                arguments.setdefault(call.index, []).append(call.function.arguments or "")
            finish = chunk.choices[0].finish_reason or finish
        assert "".join(content) == family.content
        assert "".join(reasoning) == (family.reasoning or "")
        assert [(names[i], json.loads("".join(arguments[i]))) for i in sorted(names)] == CALLS
        assert finish == "tool_calls"
        client.close()

    await trio.to_thread.run_sync(use_client)
