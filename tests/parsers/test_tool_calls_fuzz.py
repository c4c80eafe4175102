"""Generated calls, rendered as each model's chat template writes them, parse back exactly under
any chunking; text that holds no call comes back as content, byte for byte."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from typing import Any

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from trio_direct.parsers.tools import ToolCall, assemble, tool_call_parser

FUZZ = settings(max_examples=40, deadline=None, database=None)

DS_CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
DS_CALLS_END = "<｜tool▁calls▁end｜>"
DS_CALL_BEGIN = "<｜tool▁call▁begin｜>"
DS_CALL_END = "<｜tool▁call▁end｜>"
DS_SEP = "<｜tool▁sep｜>"

# Characters that stress the parsers: braces, quotes, escapes, tag openers, newlines, CJK.
TRICKY = "ab Z09_{}[]\"'\\<>/=|:;,.\n\t北"
# Markup fragments that must survive inside string values of the JSON-argument formats.
FRAGMENTS = ["</tool_call>", "<tool_call>", "[TOOL_CALLS]", "[ARGS]", DS_CALL_END, "}]", "\\n",
             "<|tool_call_end|>", "```", "<parameter=", "</arg_value>"]

names = st.from_regex(r"[a-z][a-z0-9_]{0,11}", fullmatch=True)
keys = st.from_regex(r"[a-z][a-z0-9_]{0,7}", fullmatch=True)
strings = st.lists(st.one_of(st.text(TRICKY, max_size=6), st.sampled_from(FRAGMENTS)),
                   max_size=4).map("".join)
scalars = st.one_of(st.integers(-10**6, 10**6), st.booleans(), st.none(), strings,
                    st.floats(-1e6, 1e6, allow_nan=False).map(lambda f: round(f, 3)))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(keys, inner, max_size=3)), max_leaves=6)
arguments = st.dictionaries(keys, values, max_size=4)
calls = st.lists(st.tuples(names, arguments), min_size=1, max_size=3)
# Prose around the calls: anything but a start marker.
prose = st.text("ab .,!?\n北<[{", max_size=20)


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _hermes(cs):
    return "\n".join(f"<tool_call>\n{_json({'name': n, 'arguments': a})}\n</tool_call>"
                     for n, a in cs)


def _llama(cs):
    return "<|python_tag|>" + "; ".join(_json({"name": n, "parameters": a}) for n, a in cs)


def _mistral_array(cs):
    return "[TOOL_CALLS] " + _json([{"name": n, "arguments": a} for n, a in cs])


def _mistral_compact(cs):
    return "".join(f"[TOOL_CALLS]{n}[ARGS]{_json(a)}" for n, a in cs)


def _deepseek_v3(cs):
    body = "\n".join(f"{DS_CALL_BEGIN}function{DS_SEP}{n}\n```json\n{_json(a)}\n```{DS_CALL_END}"
                     for n, a in cs)
    return f"{DS_CALLS_BEGIN}{body}{DS_CALLS_END}"


def _deepseek_v31(cs):
    body = "".join(f"{DS_CALL_BEGIN}{n}{DS_SEP}{_json(a)}{DS_CALL_END}" for n, a in cs)
    return f"{DS_CALLS_BEGIN}{body}{DS_CALLS_END}"


def _kimi(cs):
    body = "".join(f"<|tool_call_begin|>functions.{n}:{i}<|tool_call_argument_begin|>{_json(a)}"
                   "<|tool_call_end|>" for i, (n, a) in enumerate(cs))
    return f"<|tool_calls_section_begin|>{body}<|tool_calls_section_end|>"


def _pythonic_bare(cs):
    return "[" + ", ".join(f"{n}({', '.join(f'{k}={v!r}' for k, v in a.items())})"
                           for n, a in cs) + "]"


def _pythonic(cs):
    return f"<|python_start|>{_pythonic_bare(cs)}<|python_end|>"


def _llama_bare(cs):
    return ";\n".join(_json({"name": n, "parameters": a}) for n, a in cs)


def _qwen3_coder(cs):
    def value(v):
        return v if isinstance(v, str) else _json(v)
    return "\n".join(
        f"<tool_call>\n<function={n}>\n"
        + "".join(f"<parameter={k}>\n{value(v)}\n</parameter>\n" for k, v in a.items())
        + "</function>\n</tool_call>" for n, a in cs)


def _glm(cs, newline="\n"):
    def value(v):
        return v if isinstance(v, str) else _json(v)
    return "".join(
        f"<tool_call>{n}{newline}"
        + "".join(f"<arg_key>{k}</arg_key>{newline}<arg_value>{value(v)}</arg_value>{newline}"
                  for k, v in a.items())
        + "</tool_call>" for n, a in cs)


def _glm47(cs):
    return _glm(cs, newline="")


RENDERERS: dict[str, tuple[str, Callable[[Any], str]]] = {
    "hermes": ("hermes", _hermes),
    "llama3_json": ("llama3_json", _llama),
    "mistral-array": ("mistral", _mistral_array),
    "mistral-compact": ("mistral", _mistral_compact),
    "deepseek_v3": ("deepseek_v3", _deepseek_v3),
    "deepseek_v31": ("deepseek_v31", _deepseek_v31),
    "kimi_k2": ("kimi_k2", _kimi),
    "pythonic": ("pythonic", _pythonic),
    "qwen3_coder": ("qwen3_coder", _qwen3_coder),
    "glm45": ("glm45", _glm),
    "glm47": ("glm47", _glm47),
    # Calls that must open the output: no prose before them.
    "pythonic-bare": ("pythonic", _pythonic_bare),
    "llama3_json-bare": ("llama3_json", _llama_bare),
}
XML_FORMATS = ("qwen3_coder", "glm45", "glm47")
XML_TERMINATORS = ("</parameter>", "<parameter=", "</function>", "</tool_call>", "</arg_value>",
                   "</arg_key>")


def _schema(value: Any) -> dict:
    if isinstance(value, bool):
        return {"type": "boolean"}
    if isinstance(value, int):
        return {"type": "integer"}
    if isinstance(value, float):
        return {"type": "number"}
    if isinstance(value, str):
        return {"type": "string"}
    if isinstance(value, list):
        return {"type": "array"}
    if isinstance(value, dict):
        return {"type": "object"}
    return {"type": "null"}


def _tools_for(cs) -> list[dict]:
    """One tool per call (names may repeat with other argument types: last one wins)."""
    return [{"type": "function", "function": {"name": n, "parameters": {
        "type": "object", "properties": {k: _schema(v) for k, v in a.items()}}}}
        for n, a in cs]


def _chunks(text: str, cuts: Sequence[int]) -> list[str]:
    points = sorted({0, len(text), *(c % (len(text) + 1) for c in cuts)})
    return [text[a:b] for a, b in zip(points, points[1:])]


def _run(parser_name: str, chunks: Sequence[str], tools=None) -> tuple[str, list[ToolCall]]:
    parser = tool_call_parser(parser_name, tools, rng=random.Random(11))
    deltas = [parser.feed(c) for c in chunks] + [parser.finish()]
    return assemble(deltas)


@FUZZ
@given(style=st.sampled_from(sorted(RENDERERS)), cs=calls, before=prose, after=prose,
       cuts=st.lists(st.integers(0, 100_000), max_size=10))
def test_rendered_calls_parse_back_under_any_chunking(style, cs, before, after, cuts) -> None:
    parser_name, render = RENDERERS[style]
    if parser_name in XML_FORMATS:
        # Bare-text values cannot contain their own closing tag, and a name must be unique
        # for its schema to type it.
        blob = json.dumps(cs, ensure_ascii=False)
        assume(not any(t in str(v) for _, a in cs for v in a.values() for t in XML_TERMINATORS))
        assume(len({n for n, _ in cs}) == len(cs))
        assume("</arg_key>" not in blob)
    after = after.lstrip("{[;,")  # text right after a call list may not continue the list
    if style.endswith("-bare"):
        before = ""
    text = before + render(cs) + after
    tools = _tools_for(cs)
    whole = _run(parser_name, [text], tools)
    content, parsed = whole
    assert content == before.rstrip() + after.lstrip()
    assert [(c.name, json.loads(c.arguments_json)) for c in parsed] == cs
    if parser_name not in (*XML_FORMATS, "pythonic"):
        assert [c.arguments_json for c in parsed] == [_json(a) for _, a in cs]  # verbatim
    assert _run(parser_name, _chunks(text, cuts), tools) == whole


MARKUP = ["<tool_call>", "</tool_call>", "<function=", "<parameter=", "</parameter>", "</function>",
          "<|python_tag|>", "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", "<|python_start|>",
          "<|python_end|>", DS_CALLS_BEGIN, DS_CALL_BEGIN, DS_SEP, DS_CALL_END, DS_CALLS_END,
          "<|tool_calls_section_begin|>", "<|tool_call_begin|>", "<|tool_call_argument_begin|>",
          "<|tool_call_end|>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>",
          '{"name": "f"', '"arguments": ', '"name": ', "f(", "a=1", "```json\n", "functions.f:0",
          "get_weather\n", "[", "]", "{", "}", '"', ";", ",", "\n", " ", "<", "|", "x"]
garbage = st.lists(st.sampled_from(MARKUP), max_size=14).map("".join)


@settings(max_examples=150, deadline=None, database=None)
@given(parser_name=st.sampled_from(["hermes", "qwen3_coder", "llama3_json", "mistral",
                                    "pythonic", "deepseek_v3", "deepseek_v31", "kimi_k2",
                                    "glm45"]),
       text=garbage, cuts=st.lists(st.integers(0, 100_000), max_size=8))
def test_markup_soup_is_chunking_independent_and_loses_nothing(parser_name, text, cuts) -> None:
    whole = _run(parser_name, [text])
    assert _run(parser_name, _chunks(text, cuts)) == whole
    content, parsed = whole
    if not parsed:
        assert content == text  # nothing was a call, so all of it is content
    for call in parsed:
        assert call.name and call.arguments_json  # never an empty name or arguments


@FUZZ
@given(parser_name=st.sampled_from(["hermes", "qwen3_coder", "llama3_json", "mistral",
                                    "pythonic", "deepseek_v3", "deepseek_v31", "kimi_k2",
                                    "glm45", "passthrough"]),
       text=st.text(max_size=60), cuts=st.lists(st.integers(0, 1000), max_size=8))
def test_arbitrary_text_without_calls_is_content_unchanged(parser_name, text, cuts) -> None:
    content, parsed = _run(parser_name, _chunks(text, cuts))
    assume(not parsed)
    assert content == text
