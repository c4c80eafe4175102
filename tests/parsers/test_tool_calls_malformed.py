"""What users see when a model writes broken tool markup or is cut off by `max_tokens`."""

from __future__ import annotations

import json
import random

import pytest

from trio_direct.parsers.tools import assemble, tool_call_parser

DS_CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
DS_CALL_BEGIN = "<｜tool▁call▁begin｜>"
DS_SEP = "<｜tool▁sep｜>"

NOT_A_CALL = [
    ("hermes", "<tool_call>hello</tool_call> world"),
    ("hermes", '<tool_call>{"arguments": {"a": 1}}</tool_call>'),  # no name
    ("hermes", '<tool_call>{"name": "two words", "arguments": {}}</tool_call>'),
    ("qwen3_coder", "<tool_call>\nnot a function\n</tool_call>"),
    ("llama3_json", '{"answer": 42} is the JSON you asked for'),
    ("llama3_json", '{"name": "john", "age": 30}'),  # a record, not a call
    ("llama3_json", "<|python_tag|>print('hi')"),
    ("mistral", "[TOOL_CALLS] I cannot call a tool for that."),
    ("pythonic", "[Note(this is prose)] and more"),
    ("pythonic", "[f(1, 2)]"),  # positional arguments
    ("pythonic", "[1, 2, 3]"),
    ("deepseek_v3", f"{DS_CALLS_BEGIN}garbage"),
    ("deepseek_v31", f"{DS_CALLS_BEGIN}{DS_CALL_BEGIN}not a name{DS_SEP}{{}}"),
    ("kimi_k2", "<|tool_calls_section_begin|><|tool_call_begin|>bad id"
                "<|tool_call_argument_begin|>{}<|tool_call_end|>"),
    ("glm45", "<tool_call>I think that\n</tool_call>"),
]


@pytest.mark.parametrize(("parser_name", "text"), NOT_A_CALL)
def test_malformed_markup_stays_content_byte_for_byte(parser_name: str, text: str) -> None:
    parser = tool_call_parser(parser_name)
    assert parser.parse_complete(text) == (text, [])
    streamed = tool_call_parser(parser_name)
    assert assemble([*(streamed.feed(c) for c in text), streamed.finish()]) == (text, [])


@pytest.mark.parametrize(("parser_name", "text"), [
    ("hermes", "<tool_call>hello</tool_call>"),
    ("mistral", "[TOOL_CALLS] nothing"),
    ("glm45", "<tool_call>I think\n"),
])
def test_markup_left_in_content_is_reported(parser_name: str, text: str) -> None:
    parser = tool_call_parser(parser_name)
    parser.parse_complete(text)
    assert any("kept as content" in a for a in parser.anomalies)


def test_plain_json_answers_are_not_anomalies() -> None:
    parser = tool_call_parser("llama3_json")
    parser.parse_complete('{"answer": 42}')
    assert parser.anomalies == []


CUT_OFF = [
    ("hermes", 'Sure.<tool_call>{"name": "write", "arguments": {"text": "half of it',
     '{"text": "half of it', False),
    ("llama3_json", '{"name": "write", "parameters": {"n": [1, 2', '{"n": [1, 2', False),
    ("mistral", '[TOOL_CALLS]write[ARGS]{"text": "ab', '{"text": "ab', False),
    ("deepseek_v31", f'{DS_CALLS_BEGIN}{DS_CALL_BEGIN}write{DS_SEP}{{"a": 1',
     '{"a": 1', False),
    ("kimi_k2", '<|tool_calls_section_begin|><|tool_call_begin|>functions.write:0'
                '<|tool_call_argument_begin|>{"a"', '{"a"', False),
    # Formats whose arguments the parser writes itself stay valid JSON.
    ("qwen3_coder", "<tool_call>\n<function=write>\n<parameter=text>\nhalf of it\n</para",
     '{"text": "half of it"}', True),
    ("glm45", "<tool_call>write\n<arg_key>text</arg_key>\n<arg_value>half", '{"text": "half"}',
     True),
    ("pythonic", "[write(a=1, text='half", '{"a": 1}', True),
]


@pytest.mark.parametrize(("parser_name", "text", "arguments", "valid_json"), CUT_OFF)
def test_a_call_cut_off_by_max_tokens_keeps_what_arrived(parser_name, text, arguments,
                                                         valid_json) -> None:
    parser = tool_call_parser(parser_name, rng=random.Random(0))
    content, calls = parser.parse_complete(text)
    assert [(c.name, c.arguments_json) for c in calls] == [("write", arguments)]
    assert content in ("", "Sure.")
    assert any("cut off" in a for a in parser.anomalies)
    if valid_json:
        json.loads(calls[0].arguments_json)


def test_a_name_without_arguments_gets_an_empty_object_not_an_empty_string() -> None:
    for parser_name, text in [("hermes", '<tool_call>{"name": "now"}</tool_call>'),
                              ("mistral", '[TOOL_CALLS] [{"name": "now"}]'),
                              ("qwen3_coder", "<tool_call><function=now></function></tool_call>"),
                              ("glm45", "<tool_call>now</tool_call>"),
                              ("pythonic", "[now()]")]:
        calls = tool_call_parser(parser_name).parse_complete(text)[1]
        assert [(c.name, c.arguments_json) for c in calls] == [("now", "{}")], parser_name


def test_calls_to_tools_not_in_the_request_are_still_reported() -> None:
    tools = [{"type": "function", "function": {"name": "known", "parameters": {}}}]
    calls = tool_call_parser("hermes", tools).parse_complete(
        '<tool_call>{"name": "invented", "arguments": {"x": 1}}</tool_call>')[1]
    assert [(c.name, c.arguments_json) for c in calls] == [("invented", '{"x": 1}')]


def test_junk_inside_a_committed_call_is_skipped_and_reported() -> None:
    parser = tool_call_parser("glm45")
    content, calls = parser.parse_complete(
        "<tool_call>f\n<arg_key>a</arg_key>junk<arg_value>1</arg_value>\n?!\n"
        "<arg_key>b</arg_key><arg_value>x</arg_value></tool_call>after")
    assert (content, [(c.name, json.loads(c.arguments_json)) for c in calls]) == (
        "after", [("f", {"a": 1, "b": "x"})])
    assert sum("junk" in a for a in parser.anomalies) == 2


def test_hermes_forgives_a_missing_end_tag_between_calls() -> None:
    calls = tool_call_parser("hermes").parse_complete(
        '<tool_call>{"name": "f", "arguments": {}}\n<tool_call>{"name": "g", "arguments": {}}'
        "</tool_call>")[1]
    assert [c.name for c in calls] == ["f", "g"]


def test_qwen3_coder_parameter_closed_by_the_next_tag() -> None:
    calls = tool_call_parser("qwen3_coder").parse_complete(
        "<tool_call>\n<function=f>\n<parameter=a>\nx\n<parameter=b>\ny\n</function>\n"
        "</tool_call>")[1]
    assert json.loads(calls[0].arguments_json) == {"a": "x", "b": "y"}


@pytest.mark.parametrize(("types", "raw", "expected"), [
    ({"type": "integer"}, "42", 42),
    ({"type": "number"}, "2.5", 2.5),
    ({"type": "boolean"}, "True", True),
    ({"type": ["integer", "null"]}, "null", None),
    ({"type": "array"}, "[1, 'a']", [1, "a"]),  # Python-style lists are accepted
    ({"type": "object"}, '{"k": 1}', {"k": 1}),
    ({"type": "integer"}, "many", "many"),  # does not fit: kept as text, not dropped
    ({"anyOf": [{"type": "integer"}, {"type": "string"}]}, "7", 7),
    ({"enum": ["a", "b"]}, "a", "a"),
    ({}, "3", "3"),  # untyped stays a string for qwen3_coder
])
def test_qwen3_coder_types_values_by_the_tool_schema(types, raw, expected) -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"v": types}}}}]
    text = f"<tool_call>\n<function=f>\n<parameter=v>\n{raw}\n</parameter>\n</function>\n"
    calls = tool_call_parser("qwen3_coder", tools).parse_complete(text)[1]
    assert json.loads(calls[0].arguments_json) == {"v": expected}


def test_glm45_reads_untyped_values_as_json_when_they_are_json() -> None:
    calls = tool_call_parser("glm45").parse_complete(
        "<tool_call>f\n<arg_key>n</arg_key>\n<arg_value>3</arg_value>\n<arg_key>s</arg_key>\n"
        "<arg_value>hello</arg_value>\n<arg_key>l</arg_key>\n<arg_value>[1, 2]</arg_value>\n"
        "</tool_call>")[1]
    assert json.loads(calls[0].arguments_json) == {"n": 3, "s": "hello", "l": [1, 2]}
