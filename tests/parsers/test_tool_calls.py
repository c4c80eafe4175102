"""Tool-call parsers on the formats' published examples: whole text, and every way to stream it."""

from __future__ import annotations

import itertools
import json
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trio_direct.parsers.tools import (
    KNOWN_TOOL_CALL_PARSERS,
    ToolCall,
    ToolDelta,
    UnknownToolCallParser,
    assemble,
    tool_call_parser,
)

FUZZ = settings(max_examples=60, deadline=None, database=None)

DS_CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
DS_CALLS_END = "<｜tool▁calls▁end｜>"
DS_CALL_BEGIN = "<｜tool▁call▁begin｜>"
DS_CALL_END = "<｜tool▁call▁end｜>"
DS_SEP = "<｜tool▁sep｜>"


def _tool(name: str, **properties: str) -> dict:
    return {
        "type": "function",
        "function": {
            "name": name,
            "parameters": {"type": "object", "properties": {k: {"type": t} for k, t in properties.items()}},
        },
    }


WEATHER_TOOLS = [
    _tool("get_weather", location="string", city="string", date="string", days="integer", unit="string"),
]


@dataclass(frozen=True)
class Case:
    id: str
    parser: str
    text: str
    content: str
    calls: tuple[tuple[str, dict[str, Any]], ...]
    tools: Sequence[dict] | None = None


CASES = [
    # Qwen2.5 function-calling guide (qwen.readthedocs.io), two parallel calls.
    Case(
        "hermes-qwen25-parallel",
        "hermes",
        '<tool_call>\n{"name": "get_current_temperature", "arguments": {"location": '
        '"San Francisco, CA, USA"}}\n</tool_call>\n<tool_call>\n{"name": '
        '"get_temperature_date", "arguments": {"location": "San Francisco, CA, USA", "date": '
        '"2024-10-01"}}\n</tool_call>',
        "",
        (
            ("get_current_temperature", {"location": "San Francisco, CA, USA"}),
            ("get_temperature_date", {"location": "San Francisco, CA, USA", "date": "2024-10-01"}),
        ),
    ),
    Case(
        "hermes-content-around",
        "hermes",
        'Let me check.\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": '
        '"Paris", "note": "a } and a </tool_call> inside"}}\n</tool_call>\n\nDone.',
        "Let me check.Done.",
        (("get_weather", {"city": "Paris", "note": "a } and a </tool_call> inside"}),),
    ),
    Case(
        "hermes-arguments-as-string",
        "hermes",
        '<tool_call>{"arguments": "{\\"q\\": 1}", "name": "search"}</tool_call>',
        "",
        (("search", {"q": 1}),),
    ),
    # Qwen3-Coder chat template shape; `days` is typed by the schema.
    Case(
        "qwen3-coder",
        "qwen3_coder",
        "I'll check.\n<tool_call>\n<function=get_weather>\n<parameter=location>\n"
        "San Francisco, CA\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n"
        "</tool_call>",
        "I'll check.",
        (("get_weather", {"location": "San Francisco, CA", "days": 3}),),
        WEATHER_TOOLS,
    ),
    Case(
        "qwen3-coder-multiline-untyped",
        "qwen3_coder",
        "<tool_call>\n<function=write_file>\n<parameter=path>\na.py\n</parameter>\n"
        '<parameter=content>\ndef f():\n    return "<x>"\n\n</parameter>\n</function>\n'
        "</tool_call>\n<tool_call>\n<function=run>\n</function>\n</tool_call>",
        "",
        (("write_file", {"path": "a.py", "content": 'def f():\n    return "<x>"\n'}), ("run", {})),
    ),
    # Meta Llama 3.1 model card, JSON tool calling (bare and with <|python_tag|>).
    Case(
        "llama3-bare",
        "llama3_json",
        '{"name": "get_current_conditions", "parameters": {"location": "San Francisco, CA", "unit": "Fahrenheit"}}',
        "",
        (("get_current_conditions", {"location": "San Francisco, CA", "unit": "Fahrenheit"}),),
    ),
    Case(
        "llama3-python-tag-parallel",
        "llama3_json",
        'Sure.<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; '
        '{"name": "get_time", "parameters": {"tz": "CET"}}',
        "Sure.",
        (("get_weather", {"city": "Paris"}), ("get_time", {"tz": "CET"})),
    ),
    # Mistral-7B-Instruct-v0.3 (function calling example), and the newer compact format.
    Case(
        "mistral-v3-array",
        "mistral",
        '[TOOL_CALLS] [{"name": "get_current_weather", "arguments": {"location": '
        '"Paris, France", "format": "celsius"}}]',
        "",
        (("get_current_weather", {"location": "Paris, France", "format": "celsius"}),),
    ),
    Case(
        "mistral-compact",
        "mistral",
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{"tz": "CET"}',
        "",
        (("get_weather", {"city": "Paris"}), ("get_time", {"tz": "CET"})),
    ),
    # Llama 3.2 model card, zero-shot function calling.
    Case(
        "pythonic-llama32",
        "pythonic",
        "[get_user_info(user_id=7890, special='black'), get_weather(city=\"San Francisco\", "
        "days=[1, 2], metric=True, extra=None)]",
        "",
        (
            ("get_user_info", {"user_id": 7890, "special": "black"}),
            ("get_weather", {"city": "San Francisco", "days": [1, 2], "metric": True, "extra": None}),
        ),
    ),
    Case(
        "pythonic-llama4-tags",
        "pythonic",
        "Checking.<|python_start|>[get_time(tz='CET')]<|python_end|>",
        "Checking.",
        (("get_time", {"tz": "CET"}),),
    ),
    # SGLang's DeepSeekV3Detector docstring example (DeepSeek-V3-0324 template).
    Case(
        "deepseek-v3",
        "deepseek_v3",
        f"{DS_CALLS_BEGIN}{DS_CALL_BEGIN}function{DS_SEP}get_current_weather\n```json\n"
        f'{{"location": "Tokyo"}}\n```{DS_CALL_END}\n{DS_CALL_BEGIN}function{DS_SEP}'
        f'get_current_weather\n```json\n{{"location": "Paris"}}\n```{DS_CALL_END}'
        f"{DS_CALLS_END}",
        "",
        (("get_current_weather", {"location": "Tokyo"}), ("get_current_weather", {"location": "Paris"})),
    ),
    # SGLang's DeepSeekV31Detector docstring example (DeepSeek-V3.1 template).
    Case(
        "deepseek-v31",
        "deepseek_v31",
        f"Let me look.{DS_CALLS_BEGIN}{DS_CALL_BEGIN}get_current_weather{DS_SEP}"
        f'{{"location": "Tokyo"}}{DS_CALL_END}{DS_CALL_BEGIN}get_current_weather{DS_SEP}'
        f'{{"location": "Paris"}}{DS_CALL_END}{DS_CALLS_END}',
        "Let me look.",
        (("get_current_weather", {"location": "Tokyo"}), ("get_current_weather", {"location": "Paris"})),
    ),
    # Kimi-K2-Instruct docs/tool_call_guidance.md.
    Case(
        "kimi-k2",
        "kimi_k2",
        "I'll check.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
        '<|tool_call_argument_begin|>{"city": "Beijing"}<|tool_call_end|>'
        "<|tool_call_begin|>functions.get_time:1<|tool_call_argument_begin|>{}"
        "<|tool_call_end|><|tool_calls_section_end|>",
        "I'll check.",
        (("get_weather", {"city": "Beijing"}), ("get_time", {})),
    ),
    # SGLang's Glm4MoeDetector docstring example; `days` typed, `flag` inferred.
    Case(
        "glm45",
        "glm45",
        "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>北京</arg_value>\n"
        "<arg_key>date</arg_key>\n<arg_value>2024-06-27</arg_value>\n<arg_key>days</arg_key>\n"
        "<arg_value>3</arg_value>\n<arg_key>flag</arg_key>\n<arg_value>true</arg_value>\n"
        "</tool_call>",
        "",
        (("get_weather", {"city": "北京", "date": "2024-06-27", "days": 3, "flag": True}),),
        WEATHER_TOOLS,
    ),
    # GLM-4.7 drops the newlines.
    Case(
        "glm47-no-newlines",
        "glm47",
        "On it.<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value>"
        "</tool_call><tool_call>get_time</tool_call>",
        "On it.",
        (("get_weather", {"city": "Paris"}), ("get_time", {})),
        WEATHER_TOOLS,
    ),
    # smg's tool_parser_json.rs (test_simple_json_tool_call, test_json_with_parameters_key).
    Case(
        "json-object",
        "json",
        '{"name": "get_weather", "arguments": {"location": "San Francisco"}}',
        "",
        (("get_weather", {"location": "San Francisco"}),),
    ),
    Case(
        "json-array-parameters",
        "json",
        '[{"name": "calculate", "parameters": {"x": 10, "y": 20}}, {"name": "ping", "arguments": {}}]',
        "",
        (("calculate", {"x": 10, "y": 20}), ("ping", {})),
    ),
    # smg's tool_parser_deepseek_dsml.rs: V3.2 parameters, typed by `string=`, and direct JSON.
    Case(
        "deepseek-v32-dsml",
        "deepseek32",
        'Let me check that.\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name="get_weather">\n'
        '<｜DSML｜parameter name="location" string="true">Tokyo</｜DSML｜parameter>\n'
        '<｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>\n</｜DSML｜invoke>\n'
        '<｜DSML｜invoke name="get_news">\n{"location": "Beijing", "date": "2024-01-16"}\n'
        "</｜DSML｜invoke>\n</｜DSML｜function_calls>",
        "Let me check that.",
        (
            ("get_weather", {"location": "Tokyo", "days": 3}),
            ("get_news", {"location": "Beijing", "date": "2024-01-16"}),
        ),
    ),
    Case(
        "deepseek-v4-dsml",
        "deepseek_v4",
        '<｜DSML｜tool_calls>\n<｜DSML｜invoke name="search">\n<｜DSML｜parameter name="query" '
        'string="true">rust programming</｜DSML｜parameter>\n<｜DSML｜parameter name="filters" '
        'string="false">{"lang": ["en"]}</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>',
        "",
        (("search", {"query": "rust programming", "filters": {"lang": ["en"]}}),),
    ),
    # smg's tool_parser_step3.rs (single and typed examples).
    Case(
        "step3",
        "step3",
        "Let me help you.\n<｜tool_calls_begin｜>\n<｜tool_call_begin｜>function<｜tool_sep｜>"
        '<steptml:invoke name="search">\n<steptml:parameter name="query">rust programming'
        '</steptml:parameter>\n<steptml:parameter name="limit">10</steptml:parameter>\n</steptml:invoke>'
        '<｜tool_call_end｜>\n<｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke name="process">\n'
        '<steptml:parameter name="rate">2.5</steptml:parameter>\n<steptml:parameter name="active">'
        'true</steptml:parameter>\n<steptml:parameter name="optional">null</steptml:parameter>\n'
        "</steptml:invoke><｜tool_call_end｜>\n<｜tool_calls_end｜>",
        "Let me help you.",
        (
            ("search", {"query": "rust programming", "limit": 10}),
            ("process", {"rate": 2.5, "active": True, "optional": None}),
        ),
    ),
    # smg's sarashina.rs tests: with and without the marker, Python literals.
    Case(
        "sarashina-marker",
        "sarashina",
        "Let me check.<|tool_calls|>[{'name': 'get_weather', 'arguments': {'city': 'Tokyo'}}, "
        "{'name': 'flags', 'arguments': {'a': True, 'b': False, 'c': None}}]",
        "Let me check.",
        (("get_weather", {"city": "Tokyo"}), ("flags", {"a": True, "b": False, "c": None})),
    ),
    Case(
        "sarashina-bare",
        "sarashina",
        "[{'name': 'say', 'arguments': {'text': 'it\\'s [done]'}}]",
        "",
        (("say", {"text": "it's [done]"}),),
    ),
    # Kimi K3 XTML (the format in smg's kimi_k3.rs): response channel unwrapped, typed arguments.
    Case(
        "kimi-k3",
        "kimi_k3",
        "<|open|>response<|sep|>Let me check.<|close|>response<|sep|><|open|>tools<|sep|>"
        '<|open|>call tool="get_weather" index="1"<|sep|><|open|>argument key="city" type="string"<|sep|>'
        'Paris<|close|>argument<|sep|><|open|>argument key="days" type="integer"<|sep|>3'
        '<|close|>argument<|sep|><|close|>call<|sep|><|open|>call tool="get_time" index="2"<|sep|>'
        "<|close|>call<|sep|><|close|>tools<|sep|>",
        "Let me check.",
        (("get_weather", {"city": "Paris", "days": 3}), ("get_time", {})),
    ),
    # smg's tool_parser_inkling.rs (test_inkling_complete_parsing).
    Case(
        "inkling",
        "inkling",
        "<|message_model|><|content_text|>I'll check.<|end_message|><|message_model|>search"
        '<|content_invoke_tool_json|>{"name":"search","args":{"query":"Rust {language}"}}'
        '<|end_message|><|message_model|>get_weather<|content_invoke_tool_json|>{"name":"get_weather",'
        '"args":{"city":"Tokyo"}}<|end_message|><|content_model_end_sampling|>',
        "I'll check.",
        (("search", {"query": "Rust {language}"}), ("get_weather", {"city": "Tokyo"})),
    ),
    # smg's tool_parser_minimax_m2.rs (issue #1743's call), with an escaped value and a second invoke.
    Case(
        "minimax-m2",
        "minimax_m2",
        '<minimax:tool_call>\n<invoke name="update_task">\n<parameter name="taskId">3</parameter>\n'
        '<parameter name="subject">X &amp; Y &lt;b&gt;</parameter>\n</invoke>\n<invoke name="get_weather">\n'
        '<parameter name="days">3</parameter>\n</invoke>\n</minimax:tool_call>',
        "",
        (("update_task", {"taskId": "3", "subject": "X & Y <b>"}), ("get_weather", {"days": 3})),
        [_tool("update_task", taskId="string", subject="string"), *WEATHER_TOOLS],
    ),
    # smg's tool_parser_cohere.rs (single and array shapes), Command A's tool_call_id.
    Case(
        "cohere-single",
        "cohere",
        "<|START_RESPONSE|>Let me search for that.<|END_RESPONSE|>\n<|START_ACTION|>\n"
        '{"tool_name": "search_web", "parameters": {"query": "latest news", "max_results": 5}}\n'
        "<|END_ACTION|>",
        "Let me search for that.",
        (("search_web", {"query": "latest news", "max_results": 5}),),
    ),
    Case(
        "cohere-command-a-array",
        "cohere_command4",
        '<|START_ACTION|>[\n    {"tool_call_id": "0", "tool_name": "get_weather", "parameters": '
        '{"city": "Tokyo", "units": "celsius"}},\n    {"tool_call_id": "1", "tool_name": '
        '"search_news", "parameters": {"query": "AI developments", "limit": 10}}\n]<|END_ACTION|>',
        "",
        (
            ("get_weather", {"city": "Tokyo", "units": "celsius"}),
            ("search_news", {"query": "AI developments", "limit": 10}),
        ),
    ),
    # gpt-oss harmony, as the model writes a call (OpenAI's harmony guide) and as harmony's
    # encoder renders one (recipient in the role part, `json` without `<|constrain|>`).
    Case(
        "gpt-oss-harmony",
        "gpt-oss",
        "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
        '{"location":"San Francisco"}<|call|>',
        "",
        (("get_weather", {"location": "San Francisco"}),),
    ),
    Case(
        "gpt-oss-preamble-and-two-calls",
        "harmony",
        "**Action plan**: look it up.<|start|>assistant to=functions.lookup<|channel|>commentary json"
        '<|message|>{"q": "weather"}<|call|><|start|>assistant<|channel|>commentary to=functions.get_time'
        " <|constrain|>json<|message|>{}",
        "**Action plan**: look it up.",
        (("lookup", {"q": "weather"}), ("get_time", {})),
    ),
    # SGLang's HunyuanDetector docstring shape, and the suffixed tags of the shipping tokenizer.
    Case(
        "hunyuan",
        "hunyuan",
        "Checking.\n<tool_calls>\n<tool_call>get_weather<tool_sep>\n<arg_key>city</arg_key>\n"
        "<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>\n"
        "<tool_call>get_time<tool_sep>\n</tool_call>\n</tool_calls>",
        "Checking.",
        (("get_weather", {"city": "Paris", "days": 3}), ("get_time", {})),
        WEATHER_TOOLS,
    ),
    Case(
        "hunyuan-suffixed",
        "hunyuan",
        "<tool_calls:opensource><tool_call:opensource>get_weather<tool_sep:opensource><arg_key:opensource>"
        "city</arg_key:opensource><arg_value:opensource>Oslo</arg_value:opensource></tool_call:opensource>"
        "</tool_calls:opensource>",
        "",
        (("get_weather", {"city": "Oslo"}),),
    ),
    # vLLM's test_seed_oss_tool_parser.py (0 thinking budget; two parameters).
    Case(
        "seed-oss",
        "seed_oss",
        "<seed:tool_call>\n<function=get_weather>\n<parameter=location>Barcelona, Spain</parameter>\n"
        "<parameter=unit>celsius</parameter>\n</function>\n</seed:tool_call>",
        "",
        (("get_weather", {"location": "Barcelona, Spain", "unit": "celsius"}),),
    ),
    # vLLM's granite tool parser's expected output (Granite 3.0), and 3.1's `<tool_call>`.
    Case(
        "granite",
        "granite",
        '<|tool_call|>[{"name": "get_current_weather", "arguments": {"city": "Dallas", '
        '"state": "TX", "unit": "fahrenheit"}}, {"name": "get_time", "arguments": {}}]',
        "",
        (("get_current_weather", {"city": "Dallas", "state": "TX", "unit": "fahrenheit"}), ("get_time", {})),
    ),
    Case(
        "granite-31",
        "granite",
        '<tool_call>[{"name": "get_time", "arguments": {"tz": "CET"}}]',
        "",
        (("get_time", {"tz": "CET"}),),
    ),
    # Mistral v11+ tokenizers with a call id; Qwen3-Coder under smg's and vLLM's names.
    Case(
        "mistral-v11-call-id",
        "mistral",
        '[TOOL_CALLS]get_weather[CALL_ID]a1b2c3d4e[ARGS]{"city": "Paris"}',
        "",
        (("get_weather", {"city": "Paris"}),),
    ),
    # smg 1.13's Symphony tables: their recorded outputs (`crates/symphony/src/formats/*.rs`).
    Case(
        "iquest",
        "iquest",
        "<iquest_tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value><arg_key>days</arg_key>"
        "<arg_value>3</arg_value></iquest_tool_call><iquest_tool_call>get_weather</iquest_tool_call>",
        "",
        (("get_weather", {"city": "Paris", "days": 3}), ("get_weather", {})),
        WEATHER_TOOLS,
    ),
    Case(
        "hy4",
        "hy4",
        "<tool_calls:opensource><tool_call:opensource>get_weather<arg_key:opensource>city</arg_key:opensource>"
        "<arg_value:opensource>Paris</arg_value:opensource><arg_key:opensource>days</arg_key:opensource>"
        "<arg_value:opensource>3</arg_value:opensource></tool_call:opensource>"
        "<tool_call:opensource>get_weather</tool_call:opensource></tool_calls:opensource>",
        "",
        (("get_weather", {"city": "Paris", "days": 3}), ("get_weather", {})),
        WEATHER_TOOLS,
    ),
    Case(
        "deepseek-v4.1",
        "deepseek_v4.1",
        'Sure.<\uff5cDSML\uff5c calls>\n<\uff5cDSML\uff5c invoke name="ChaDri_change_drink">\n'
        '<\uff5cDSML\uff5c parameter name="drink_id" string="true">latte</\uff5cDSML\uff5c parameter>\n'
        '<\uff5cDSML\uff5c parameter name="new_preferences" string="false">'
        '{"size": "large", "temperature": "hot"}</\uff5cDSML\uff5c parameter>\n</\uff5cDSML\uff5c invoke>\n'
        '<\uff5cDSML\uff5c invoke name="get_stock_price">\n\n</\uff5cDSML\uff5c invoke>\n</\uff5cDSML\uff5c calls>',
        "Sure.",
        (
            ("ChaDri_change_drink", {"drink_id": "latte", "new_preferences": {"size": "large", "temperature": "hot"}}),
            ("get_stock_price", {}),
        ),
    ),
    Case(
        "ling",
        "ling",
        "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value><arg_key>days</arg_key>\n"
        "<arg_value>3</arg_value>\n</tool_call>\n<tool_call>get_weather\n</tool_call>",
        "",
        (("get_weather", {"city": "Paris", "days": 3}), ("get_weather", {})),
        WEATHER_TOOLS,
    ),
    Case(
        "glm-table",
        "glm",
        "Two drinks.<tool_call>ChaDri_change_drink<arg_key>drink_id</arg_key><arg_value>123</arg_value>"
        "</tool_call><tool_call>ChaDri_change_drink<arg_key>drink_id</arg_key><arg_value>tea</arg_value>"
        "</tool_call>",
        "Two drinks.",
        (("ChaDri_change_drink", {"drink_id": "123"}), ("ChaDri_change_drink", {"drink_id": "tea"})),
        [_tool("ChaDri_change_drink", drink_id="string")],
    ),
    Case(
        "qwen2.5-table",
        "qwen2.5",
        '<think>\nplan\n</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        "<think>\nplan\n</think>",  # `<think>` is text; the blank line before the call is dropped
        (("get_weather", {"city": "Paris"}),),
    ),
    Case(
        "xlam",
        "xlam",
        '[{"name": "get_weather", "arguments": {"city": "Paris"}}]',
        "",
        (("get_weather", {"city": "Paris"}),),
    ),
    Case(
        "lfm2.5",
        "lfm2.5",
        "<|tool_call_start|>[get_weather(city='Paris'), get_weather(city='Oslo', days=2)]<|tool_call_end|>Checking.",
        "Checking.",
        (("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Oslo", "days": 2})),
    ),
    Case(
        "olmo3",
        "olmo3",
        'Let me look.<function_calls>\nget_weather(city="Paris")\nget_weather(city="Oslo", days=2)\n</function_calls>',
        "Let me look.",
        (("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Oslo", "days": 2})),
    ),
    # Llama-Nemotron's `<TOOLCALL>` tokens (smg's `llama_nemotron` table) around a JSON array.
    Case(
        "llama-nemotron",
        "llama_nemotron",
        '<TOOLCALL>[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_weather", '
        '"arguments": {"city": "Oslo"}}]</TOOLCALL>',
        "",
        (("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Oslo"})),
    ),
    # vLLM's tests/tool_parsers/test_gemma4_tool_parser.py (the markup of Gemma 4's chat template,
    # `<|tool_call>call:NAME{...}<tool_call|>` with `<|"|>` around strings).
    Case(
        "gemma4-text-before",
        "gemma4",
        'Let me check the weather for you. <|tool_call>call:get_weather{location:<|"|>Paris<|"|>}<tool_call|>',
        "Let me check the weather for you.",
        (("get_weather", {"location": "Paris"}),),
    ),
    Case(
        "gemma4-two-calls",
        "gemma4",
        '<|tool_call>call:get_weather{location:<|"|>London<|"|>}<tool_call|>'
        '<|tool_call>call:get_time{location:<|"|>London<|"|>}<tool_call|>',
        "",
        (("get_weather", {"location": "London"}), ("get_time", {"location": "London"})),
    ),
    Case(
        "gemma4-nested",
        "gemma4",
        '<|tool_call>call:complex_function{nested:{inner:<|"|>value<|"|>},list:[<|"|>a<|"|>,<|"|>b<|"|>]}<tool_call|>',
        "",
        (("complex_function", {"nested": {"inner": "value"}, "list": ["a", "b"]}),),
    ),
    Case(
        "gemma4-scalars",
        "gemma4",
        "<|tool_call>call:set_status{is_active:true,count:42,score:3.14}<tool_call|>"
        "<|tool_call>call:get-status{}<tool_call|>",
        "",
        (("set_status", {"is_active": True, "count": 42, "score": 3.14}), ("get-status", {})),
    ),
    Case(
        "gemma4-quoted-keys-and-schema",
        "gemma4",
        '<|tool_call>call:update{record_map:{<|"|>3<|"|>:<|"|>new, {text}<|"|>},zip:02139,days:<|"|>2<|"|>}'
        "<tool_call|>Done.",
        "Done.",
        (("update", {"record_map": {"3": "new, {text}"}, "zip": "02139", "days": 2}),),
        [_tool("update", record_map="object", zip="string", days="integer")],
    ),
    # vLLM's tests/tool_parsers/test_functiongemma_tool_parser.py: FunctionGemma's tokens, `<escape>`.
    Case(
        "function-gemma",
        "function_gemma",
        "Let me check. <start_function_call>call:get_weather{location:<escape>London<escape>}<end_function_call>"
        "<start_function_call>call:get_time{timezone:<escape>UTC<escape>,offset:-2}<end_function_call>",
        "Let me check.",
        (("get_weather", {"location": "London"}), ("get_time", {"timezone": "UTC", "offset": -2})),
    ),
    # vLLM's tests/tool_parsers/test_minimax_m3_tool_parser.py (`build_order_call`, its tools): the
    # separator before every tag, nested objects, arrays of `<item>`s, a repeated name.
    Case(
        "minimax-m3-nested",
        "minimax_m3",
        'I will create it.\n]<]minimax[>[<tool_call>\n]<]minimax[>[<invoke name="create_order">'
        "]<]minimax[>[<user_id>42]<]minimax[>[</user_id>]<]minimax[>[<urgent>true]<]minimax[>[</urgent>"
        "]<]minimax[>[<note>Please leave at front desk.]<]minimax[>[</note>]<]minimax[>[<shipping>"
        "]<]minimax[>[<city>Singapore]<]minimax[>[</city>]<]minimax[>[<zip>018956]<]minimax[>[</zip>"
        "]<]minimax[>[</shipping>]<]minimax[>[<items>]<]minimax[>[<item>]<]minimax[>[<sku>book-001"
        "]<]minimax[>[</sku>]<]minimax[>[<qty>2]<]minimax[>[</qty>]<]minimax[>[</item>]<]minimax[>[<item>"
        "]<]minimax[>[<sku>pen-007]<]minimax[>[</sku>]<]minimax[>[<qty>5]<]minimax[>[</qty>]<]minimax[>[</item>"
        "]<]minimax[>[</items>]<]minimax[>[<metadata>]<]minimax[>[<source>mobile]<]minimax[>[</source>"
        "]<]minimax[>[<campaign>may-launch]<]minimax[>[</campaign>]<]minimax[>[</metadata>"
        "]<]minimax[>[<duplicate_demo>]<]minimax[>[<tag>a]<]minimax[>[</tag>]<]minimax[>[<tag>b"
        "]<]minimax[>[</tag>]<]minimax[>[</duplicate_demo>]<]minimax[>[</invoke>\n]<]minimax[>[</tool_call>",
        "I will create it.",
        (
            (
                "create_order",
                {
                    "user_id": 42,
                    "urgent": True,
                    "note": "Please leave at front desk.",
                    "shipping": {"city": "Singapore", "zip": 18956},
                    "items": [{"sku": "book-001", "qty": 2}, {"sku": "pen-007", "qty": 5}],
                    "metadata": {"source": "mobile", "campaign": "may-launch"},
                    "duplicate_demo": {"tag": ["a", "b"]},
                },
            ),
        ),
        [
            {
                "type": "function",
                "function": {
                    "name": "create_order",
                    "parameters": {
                        "type": "object",
                        "properties": {
                            "user_id": {"type": "integer"},
                            "urgent": {"type": "boolean"},
                            "note": {"type": "string"},
                            "shipping": {
                                "type": "object",
                                "properties": {"city": {"type": "string"}, "zip": {"type": "integer"}},
                            },
                            "items": {
                                "type": "array",
                                "items": {
                                    "type": "object",
                                    "properties": {"sku": {"type": "string"}, "qty": {"type": "integer"}},
                                },
                            },
                            "metadata": {"type": "object", "additionalProperties": {"type": "string"}},
                            "duplicate_demo": {"type": "object"},
                        },
                    },
                },
            }
        ],
    ),
    # smg's tests/tool_parser_minimax_m3.rs: two invokes in a block, a second block, untyped values;
    # after the `minimax_m3` reasoning parser, whose content has no separators.
    Case(
        "minimax-m3-invokes-and-blocks",
        "minimax_m3",
        ']<]minimax[>[<tool_call>\n]<]minimax[>[<invoke name="get_weather">]<]minimax[>[<city>Seattle'
        ']<]minimax[>[</city>]<]minimax[>[</invoke>\n]<]minimax[>[<invoke name="search">]<]minimax[>[<query>'
        "rust &amp; go]<]minimax[>[</query>]<]minimax[>[<limit>3]<]minimax[>[</limit>]<]minimax[>[</invoke>\n"
        ']<]minimax[>[</tool_call>]<]minimax[>[<tool_call>\n]<]minimax[>[<invoke name="ping">]<]minimax[>['
        "</invoke>\n]<]minimax[>[</tool_call>",
        "",
        (("get_weather", {"city": "Seattle"}), ("search", {"query": "rust & go", "limit": 3}), ("ping", {})),
    ),
    Case(
        "minimax-m3-without-separators",
        "minimax_m3",
        'Sure.<tool_call>\n<invoke name="get_weather"><city>Seattle</city><days>2</days></invoke>\n</tool_call>',
        "Sure.",
        (("get_weather", {"city": "Seattle", "days": 2}),),
    ),
    Case(
        "qwen-xml-alias",
        "qwen_xml",
        "<tool_call>\n<function=get_weather>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>",
        "",
        (("get_weather", {"days": 2}),),
        WEATHER_TOOLS,
    ),
]


def _parser(case: Case, seed: int = 7):
    return tool_call_parser(case.parser, case.tools, rng=random.Random(seed))


def _stream(case: Case, chunks: Sequence[str]) -> tuple[str, list[ToolCall]]:
    parser = _parser(case)
    deltas = [parser.feed(chunk) for chunk in chunks]
    deltas.append(parser.finish())
    _check_openai_delta_rules(deltas)
    return assemble(deltas)


def _check_openai_delta_rules(deltas: Sequence[ToolDelta]) -> None:
    """id and name only on a call's first delta; calls start in index order from 0."""
    seen: set[int] = set()
    for delta in deltas:
        for call in delta.calls:
            first = call.index not in seen
            assert (call.id is not None, call.name is not None) == (first, first), call
            if first:
                assert call.index == len(seen), "calls must start in index order"
                seen.add(call.index)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_published_examples(case: Case) -> None:
    content, calls = _parser(case).parse_complete(case.text)
    assert content == case.content
    assert [(c.name, json.loads(c.arguments_json)) for c in calls] == list(case.calls)
    assert len({c.id for c in calls}) == len(calls)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_every_two_chunk_split_equals_the_whole(case: Case) -> None:
    whole = _parser(case).parse_complete(case.text)
    for cut in range(len(case.text) + 1):
        assert _stream(case, [case.text[:cut], case.text[cut:]]) == whole, cut


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_one_character_at_a_time_equals_the_whole(case: Case) -> None:
    assert _stream(case, list(case.text)) == _parser(case).parse_complete(case.text)


@FUZZ
@given(case=st.sampled_from(CASES), cuts=st.lists(st.integers(0, 10_000), max_size=12))
def test_random_multi_chunk_splits_equal_the_whole(case: Case, cuts: list[int]) -> None:
    points = sorted({0, len(case.text), *(c % (len(case.text) + 1) for c in cuts)})
    chunks = [case.text[a:b] for a, b in itertools.pairwise(points)]
    assert _stream(case, chunks) == _parser(case).parse_complete(case.text)


def test_arguments_stream_in_pieces_not_one_frame_at_the_end() -> None:
    parser = tool_call_parser("hermes", rng=random.Random(1))
    parser.feed('<tool_call>{"name": "write", "arguments": {"text": "')
    first = parser.feed("hello ")
    second = parser.feed("world")
    assert [c.arguments for c in first.calls] == ["hello "]
    assert [c.arguments for c in second.calls] == ["world"]


def test_name_goes_out_as_soon_as_it_is_complete() -> None:
    parser = tool_call_parser("qwen3_coder", rng=random.Random(1))
    assert not parser.feed("<tool_call>\n<function=get_wea").calls
    delta = parser.feed("ther>\n")
    assert [(c.index, c.name, c.arguments) for c in delta.calls] == [(0, "get_weather", "{")]
    assert re.fullmatch(r"call_[A-Za-z0-9]{24}", delta.calls[0].id or "")


def test_text_without_markup_streams_through_untouched() -> None:
    parser = tool_call_parser("hermes")
    assert parser.feed("Hello") == ToolDelta("Hello", [])
    assert parser.feed(", world <tool").content == ", world"  # held: maybe a marker
    assert parser.feed("box> and more  ").content == " <toolbox> and more"
    assert parser.finish() == ToolDelta("  ", [])


@pytest.mark.parametrize("parser_name", sorted(KNOWN_TOOL_CALL_PARSERS))
def test_every_known_name_builds_a_parser(parser_name: str) -> None:
    parser = tool_call_parser(parser_name.upper().replace("_", "-"), None)
    assert parser.parse_complete("plain answer") == ("plain answer", [])


def test_peer_spellings_are_aliases() -> None:
    expected = {
        "qwen25": "hermes",
        "qwen": "hermes",
        "qwen_xml": "qwen3_coder",
        "llama3": "llama3_json",
        "deepseekv3": "deepseek_v3",
        "deepseek": "deepseek_v3",
        "deepseekv31": "deepseek_v31",
        "deepseek31": "deepseek_v31",
        "deepseek_v3_1": "deepseek_v31",
        "kimik2": "kimi_k2",
        "glm": "glm45",
        "glm45_moe": "glm45",
    }
    for alias, canonical in expected.items():
        assert tool_call_parser(alias).format == canonical


def test_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown tool-call parser 'harmonyx'.*hermes.*kimi_k2"):
        tool_call_parser("harmonyx", None)
    assert issubclass(UnknownToolCallParser, ValueError)


def test_ids_are_random_unless_an_rng_is_injected() -> None:
    text = '<tool_call>{"name": "f", "arguments": {}}</tool_call>'
    a = tool_call_parser("hermes", rng=random.Random(3)).parse_complete(text)[1][0].id
    b = tool_call_parser("hermes", rng=random.Random(3)).parse_complete(text)[1][0].id
    c = tool_call_parser("hermes").parse_complete(text)[1][0].id
    d = tool_call_parser("hermes").parse_complete(text)[1][0].id
    assert a == b and c != d
    assert all(re.fullmatch(r"call_[A-Za-z0-9]{24}", x) for x in (a, c, d))


def test_kimi_keeps_the_model_ids_for_its_template() -> None:
    case = next(c for c in CASES if c.parser == "kimi_k2")
    calls = _parser(case).parse_complete(case.text)[1]
    assert [c.id for c in calls] == ["functions.get_weather:0", "functions.get_time:1"]


def test_mistral_ids_are_nine_alphanumerics_or_the_models_own() -> None:
    calls = tool_call_parser("mistral").parse_complete(
        '[TOOL_CALLS]f[ARGS]{}[TOOL_CALLS]g[CALL_ID]a1B2c3D4e[ARGS]{"x": 1}'
    )[1]
    assert re.fullmatch(r"[A-Za-z0-9]{9}", calls[0].id)
    assert (calls[1].id, calls[1].name, calls[1].arguments_json) == ("a1B2c3D4e", "g", '{"x": 1}')


def test_a_parser_serves_one_stream() -> None:
    parser = tool_call_parser("hermes")
    parser.finish()
    assert parser.finish() == ToolDelta()
    with pytest.raises(RuntimeError):
        parser.feed("more")


def test_call_count_tells_the_frontend_to_finish_with_tool_calls() -> None:
    parser = tool_call_parser("hermes")
    parser.feed("Thinking about it... <tool_call>")
    assert parser.call_count == 0
    parser.feed('{"name": "f", "arguments": {}}</tool_call>')
    assert parser.call_count == 1


def test_minimax_m3_calls_survive_the_m3_reasoning_parser_dropping_the_separators() -> None:
    from trio_direct.parsers.reasoning import reasoning_parser

    ns = "]<]minimax[>["
    text = (
        f'<mm:think>Need the weather.</mm:think>{ns}Checking.{ns}<tool_call>\n{ns}<invoke name="get_weather">'
        f"{ns}<city>Paris{ns}</city>{ns}</invoke>\n{ns}</tool_call>"
    )
    thinking = reasoning_parser("minimax_m3")
    pieces = [thinking.feed(c) for c in text] + [thinking.finish()]
    tools = tool_call_parser("minimax_m3", rng=random.Random(0))
    deltas = [tools.feed(p.content) for p in pieces] + [tools.finish()]
    content, calls = assemble(deltas)
    assert "".join(p.reasoning for p in pieces) == "Need the weather."
    assert (content, [(c.name, json.loads(c.arguments_json)) for c in calls]) == (
        "Checking.",
        [("get_weather", {"city": "Paris"})],
    )
