"""Generated calls, rendered as each model's chat template writes them, parse back exactly under
any chunking; text that holds no call comes back as content, byte for byte."""

from __future__ import annotations

import itertools
import json
import random
import re
from collections.abc import Callable, Sequence
from typing import Any

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from trio_direct.parsers.tools import TOOL_CALL_FORMATS, ToolCall, assemble, tool_call_parser

FUZZ = settings(max_examples=150, deadline=None, database=None)

DS_CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
DS_CALLS_END = "<｜tool▁calls▁end｜>"
DS_CALL_BEGIN = "<｜tool▁call▁begin｜>"
DS_CALL_END = "<｜tool▁call▁end｜>"
DS_SEP = "<｜tool▁sep｜>"
GEMMA4_QUOTE = '<|"|>'
M3 = "]<]minimax[>["

# Characters that stress the parsers: braces, quotes, escapes, tag openers, newlines, CJK.
TRICKY = "ab Z09_{}[]\"'\\<>/=|:;,.\n\t北"
# Markup fragments that must survive inside string values of the JSON-argument formats.
FRAGMENTS = [
    "</tool_call>",
    "<tool_call>",
    "[TOOL_CALLS]",
    "[ARGS]",
    DS_CALL_END,
    "}]",
    "\\n",
    "<|tool_call_end|>",
    "```",
    "<parameter=",
    "</arg_value>",
]

names = st.from_regex(r"[a-z][a-z0-9_]{0,11}", fullmatch=True)
keys = st.from_regex(r"[a-z][a-z0-9_]{0,7}", fullmatch=True)
strings = st.lists(st.one_of(st.text(TRICKY, max_size=6), st.sampled_from(FRAGMENTS)), max_size=4).map("".join)
scalars = st.one_of(
    st.integers(-(10**6), 10**6),
    st.booleans(),
    st.none(),
    strings,
    st.floats(-1e6, 1e6, allow_nan=False).map(lambda f: round(f, 3)),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(keys, inner, max_size=3)),
    max_leaves=6,
)
arguments = st.dictionaries(keys, values, max_size=4)
calls = st.lists(st.tuples(names, arguments), min_size=1, max_size=3)
# Prose around the calls: anything but a start marker.
prose = st.text("ab .,!?\n北<[{", max_size=20)


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _hermes(cs):
    return "\n".join(f"<tool_call>\n{_json({'name': n, 'arguments': a})}\n</tool_call>" for n, a in cs)


def _llama(cs):
    return "<|python_tag|>" + "; ".join(_json({"name": n, "parameters": a}) for n, a in cs)


def _mistral_array(cs):
    return "[TOOL_CALLS] " + _json([{"name": n, "arguments": a} for n, a in cs])


def _mistral_compact(cs):
    return "".join(f"[TOOL_CALLS]{n}[ARGS]{_json(a)}" for n, a in cs)


def _deepseek_v3(cs):
    body = "\n".join(f"{DS_CALL_BEGIN}function{DS_SEP}{n}\n```json\n{_json(a)}\n```{DS_CALL_END}" for n, a in cs)
    return f"{DS_CALLS_BEGIN}{body}{DS_CALLS_END}"


def _deepseek_v31(cs):
    body = "".join(f"{DS_CALL_BEGIN}{n}{DS_SEP}{_json(a)}{DS_CALL_END}" for n, a in cs)
    return f"{DS_CALLS_BEGIN}{body}{DS_CALLS_END}"


def _kimi(cs):
    body = "".join(
        f"<|tool_call_begin|>functions.{n}:{i}<|tool_call_argument_begin|>{_json(a)}<|tool_call_end|>"
        for i, (n, a) in enumerate(cs)
    )
    return f"<|tool_calls_section_begin|>{body}<|tool_calls_section_end|>"


def _pythonic_bare(cs):
    return "[" + ", ".join(f"{n}({', '.join(f'{k}={v!r}' for k, v in a.items())})" for n, a in cs) + "]"


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
        + "</function>\n</tool_call>"
        for n, a in cs
    )


def _glm(cs, newline="\n"):
    def value(v):
        return v if isinstance(v, str) else _json(v)

    return "".join(
        f"<tool_call>{n}{newline}"
        + "".join(f"<arg_key>{k}</arg_key>{newline}<arg_value>{value(v)}</arg_value>{newline}" for k, v in a.items())
        + "</tool_call>"
        for n, a in cs
    )


def _glm47(cs):
    return _glm(cs, newline="")


def _bare(v):
    return v if isinstance(v, str) else _json(v)


def _json_calls(cs):
    return _json([{"name": n, "arguments": a} for n, a in cs])


def _cohere(cs):
    items = [{"tool_call_id": str(i), "tool_name": n, "parameters": a} for i, (n, a) in enumerate(cs)]
    return "<|START_ACTION|>" + _json(items) + "<|END_ACTION|>"


def _inkling(cs):
    return "".join(
        f"<|message_model|>{n}<|content_invoke_tool_json|>{_json({'name': n, 'args': a})}<|end_message|>" for n, a in cs
    )


def _granite(cs):
    return "<|tool_call|>" + _json([{"name": n, "arguments": a} for n, a in cs])


def _sarashina(cs):
    return "<|tool_calls|>" + repr([{"name": n, "arguments": a} for n, a in cs])


def _minimax(cs):
    def esc(v):
        return _bare(v).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")

    return (
        "<minimax:tool_call>\n"
        + "".join(
            f'<invoke name="{n}">\n'
            + "".join(f'<parameter name="{k}">{esc(v)}</parameter>\n' for k, v in a.items())
            + "</invoke>\n"
            for n, a in cs
        )
        + "</minimax:tool_call>"
    )


def _step3(cs):
    return (
        "<\uff5ctool_calls_begin\uff5c>\n"
        + "".join(
            f'<\uff5ctool_call_begin\uff5c>function<\uff5ctool_sep\uff5c><steptml:invoke name="{n}">\n'
            + "".join(f'<steptml:parameter name="{k}">{_bare(v)}</steptml:parameter>\n' for k, v in a.items())
            + "</steptml:invoke><\uff5ctool_call_end\uff5c>\n"
            for n, a in cs
        )
        + "<\uff5ctool_calls_end\uff5c>"
    )


def _dsml(cs, block="function_calls", space=""):
    d = "\uff5cDSML\uff5c" + space
    return (
        f"<{d}{block}>\n"
        + "".join(
            f'<{d}invoke name="{n}">\n'
            + "".join(
                f'<{d}parameter name="{k}" string="{"true" if isinstance(v, str) else "false"}">{_bare(v)}'
                f"</{d}parameter>\n"
                for k, v in a.items()
            )
            + f"</{d}invoke>\n"
            for n, a in cs
        )
        + f"</{d}{block}>"
    )


def _dsml_v4(cs):
    return _dsml(cs, "tool_calls")


def _hunyuan(cs):
    return (
        "<tool_calls>\n"
        + "".join(
            f"<tool_call>{n}<tool_sep>\n"
            + "".join(f"<arg_key>{k}</arg_key>\n<arg_value>{_bare(v)}</arg_value>\n" for k, v in a.items())
            + "</tool_call>\n"
            for n, a in cs
        )
        + "</tool_calls>"
    )


def _seed_oss(cs):
    return "\n".join(
        f"<seed:tool_call>\n<function={n}>\n"
        + "".join(f"<parameter={k}>\n{_bare(v)}\n</parameter>\n" for k, v in a.items())
        + "</function>\n</seed:tool_call>"
        for n, a in cs
    )


def _kimi_k3(cs):
    def kind(v):
        return "string" if isinstance(v, str) else _schema(v)["type"]

    return (
        "<|open|>tools<|sep|>"
        + "".join(
            f'<|open|>call tool="{n}" index="{i + 1}"<|sep|>'
            + "".join(
                f'<|open|>argument key="{k}" type="{kind(v)}"<|sep|>{_bare(v)}<|close|>argument<|sep|>'
                for k, v in a.items()
            )
            + "<|close|>call<|sep|>"
            for i, (n, a) in enumerate(cs)
        )
        + "<|close|>tools<|sep|>"
    )


def _iquest(cs):
    return "".join(
        f"<iquest_tool_call>{n}"
        + "".join(f"<arg_key>{k}</arg_key><arg_value>{_bare(v)}</arg_value>" for k, v in a.items())
        + "</iquest_tool_call>"
        for n, a in cs
    )


def _hy4(cs):
    o = ":opensource"
    return (
        f"<tool_calls{o}>"
        + "".join(
            f"<tool_call{o}>{n}"
            + "".join(f"<arg_key{o}>{k}</arg_key{o}><arg_value{o}>{_bare(v)}</arg_value{o}>" for k, v in a.items())
            + f"</tool_call{o}>"
            for n, a in cs
        )
        + f"</tool_calls{o}>"
    )


def _dsml_v41(cs):
    return _dsml(cs, "calls", space=" ")


def _lfm2_5(cs):
    return f"<|tool_call_start|>{_pythonic_bare(cs)}<|tool_call_end|>"


def _olmo3(cs):
    lines = "".join(f"{n}({', '.join(f'{k}={v!r}' for k, v in a.items())})\n" for n, a in cs)
    return f"<function_calls>\n{lines}</function_calls>"


def _llama_nemotron(cs):
    return "<TOOLCALL>" + _json([{"name": n, "arguments": a} for n, a in cs]) + "</TOOLCALL>"


def _gemma_value(value: Any, quote: str) -> str:
    """Gemma's chat-template `format_argument`: quoted strings, bare keys, literals and numbers."""
    if isinstance(value, str):
        return f"{quote}{value}{quote}"
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{_gemma_value(v, quote)}" for k, v in sorted(value.items())) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_gemma_value(v, quote) for v in value) + "]"
    return str(value)


def _gemma4(cs):
    return "".join(f"<|tool_call>call:{n}{_gemma_value(a, GEMMA4_QUOTE)}<tool_call|>" for n, a in cs)


def _function_gemma(cs):
    return "".join(f"<start_function_call>call:{n}{_gemma_value(a, '<escape>')}<end_function_call>" for n, a in cs)


def _gpt_oss(cs):
    return "".join(
        f"<|start|>assistant<|channel|>commentary to=functions.{n} <|constrain|>json<|message|>{_json(a)}<|call|>"
        for n, a in cs
    )


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
    "cohere": ("cohere", _cohere),
    "inkling": ("inkling", _inkling),
    "granite": ("granite", _granite),
    "sarashina": ("sarashina", _sarashina),
    "minimax_m2": ("minimax_m2", _minimax),
    "step3": ("step3", _step3),
    "deepseek_v32": ("deepseek_v32", _dsml),
    "deepseek_v4": ("deepseek_v4", _dsml_v4),
    "hunyuan": ("hunyuan", _hunyuan),
    "seed_oss": ("seed_oss", _seed_oss),
    "kimi_k3": ("kimi_k3", _kimi_k3),
    "gpt_oss": ("gpt_oss", _gpt_oss),
    "iquest": ("iquest", _iquest),
    "hy4": ("hy4", _hy4),
    "deepseek_v41": ("deepseek_v41", _dsml_v41),
    "lfm2_5": ("lfm2_5", _lfm2_5),
    "olmo3": ("olmo3", _olmo3),
    "llama_nemotron": ("llama_nemotron", _llama_nemotron),
    "gemma4": ("gemma4", _gemma4),
    "function_gemma": ("function_gemma", _function_gemma),
    # Calls that must open the output: no prose before them.
    "pythonic-bare": ("pythonic", _pythonic_bare),
    "llama3_json-bare": ("llama3_json", _llama_bare),
    "json-bare": ("json", _json_calls),
    "granite-bare": ("granite", lambda cs: _granite(cs).removeprefix("<|tool_call|>")),
    "sarashina-bare": ("sarashina", lambda cs: _sarashina(cs).removeprefix("<|tool_calls|>")),
}
# Formats whose values are bare text: a value cannot hold its own closing tag.
XML_FORMATS = (
    "qwen3_coder",
    "glm45",
    "glm47",
    "minimax_m2",
    "step3",
    "deepseek_v32",
    "deepseek_v4",
    "hunyuan",
    "seed_oss",
    "kimi_k3",
    "iquest",
    "hy4",
    "deepseek_v41",
)
XML_TERMINATORS = (
    "</parameter>",
    "<parameter=",
    "</function>",
    "</tool_call>",
    "</arg_value>",
    "</arg_key>",
    "</invoke>",
    "</steptml:parameter>",
    "</steptml:invoke>",
    "</\uff5cDSML\uff5cparameter>",
    "</\uff5cDSML\uff5cinvoke>",
    "<|close|>argument<|sep|>",
    "</seed:tool_call>",
    "</iquest_tool_call>",
    "</arg_value:opensource>",
    "</tool_call:opensource>",
    "</\uff5cDSML\uff5c parameter>",
    "</\uff5cDSML\uff5c invoke>",
)
# Formats that write arguments themselves (not the model's JSON verbatim).
CONVERTED = (*XML_FORMATS, "pythonic", "sarashina", "lfm2_5", "olmo3", "gemma4", "function_gemma")
# Formats whose strings run to a quote token, which a string therefore cannot hold.
QUOTES = {"gemma4": GEMMA4_QUOTE, "function_gemma": "<escape>"}


def _strings_in(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (k, *_strings_in(v))]
    if isinstance(value, list):
        return [s for v in value for s in _strings_in(v)]
    return []


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
    return [
        {
            "type": "function",
            "function": {
                "name": n,
                "parameters": {"type": "object", "properties": {k: _schema(v) for k, v in a.items()}},
            },
        }
        for n, a in cs
    ]


def _chunks(text: str, cuts: Sequence[int]) -> list[str]:
    points = sorted({0, len(text), *(c % (len(text) + 1) for c in cuts)})
    return [text[a:b] for a, b in itertools.pairwise(points)]


def _run(parser_name: str, chunks: Sequence[str], tools=None) -> tuple[str, list[ToolCall]]:
    parser = tool_call_parser(parser_name, tools, rng=random.Random(11))
    deltas = [parser.feed(c) for c in chunks] + [parser.finish()]
    return assemble(deltas)


@FUZZ
@given(
    style=st.sampled_from(sorted(RENDERERS)),
    cs=calls,
    before=prose,
    after=prose,
    cuts=st.lists(st.integers(0, 100_000), max_size=10),
)
def test_rendered_calls_parse_back_under_any_chunking(style, cs, before, after, cuts) -> None:
    parser_name, render = RENDERERS[style]
    if parser_name in XML_FORMATS:
        # Bare-text values cannot contain their own closing tag, and a name must be unique
        # for its schema to type it.
        blob = json.dumps(cs, ensure_ascii=False)
        assume(not any(t in str(v) for _, a in cs for v in a.values() for t in XML_TERMINATORS))
        assume(len({n for n, _ in cs}) == len(cs))
        assume("</arg_key>" not in blob)
    if parser_name in QUOTES:
        assume(not any(QUOTES[parser_name] in s for _, a in cs for s in _strings_in(a)))
    after = after.lstrip("{[;,")  # text right after a call list may not continue the list
    if style.endswith("-bare"):
        before = ""

    text = before + render(cs) + after
    tools = _tools_for(cs)
    whole = _run(parser_name, [text], tools)
    content, parsed = whole
    assert content == before.rstrip() + after.lstrip()
    assert [(c.name, json.loads(c.arguments_json)) for c in parsed] == cs
    if parser_name not in CONVERTED:
        assert [c.arguments_json for c in parsed] == [_json(a) for _, a in cs]  # verbatim
    assert _run(parser_name, _chunks(text, cuts), tools) == whole


MARKUP = [
    "<tool_call>",
    "</tool_call>",
    "<function=",
    "<parameter=",
    "</parameter>",
    "</function>",
    "<|python_tag|>",
    "[TOOL_CALLS]",
    "[ARGS]",
    "[CALL_ID]",
    "<|python_start|>",
    "<|python_end|>",
    DS_CALLS_BEGIN,
    DS_CALL_BEGIN,
    DS_SEP,
    DS_CALL_END,
    DS_CALLS_END,
    "<|tool_calls_section_begin|>",
    "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
    "<arg_key>",
    "</arg_key>",
    "<arg_value>",
    "</arg_value>",
    '{"name": "f"',
    '"arguments": ',
    '"name": ',
    "f(",
    "a=1",
    "```json\n",
    "functions.f:0",
    "get_weather\n",
    "[",
    "]",
    "{",
    "}",
    '"',
    ";",
    ",",
    "\n",
    " ",
    "<",
    "|",
    "x",
    "<|START_ACTION|>",
    "<|END_ACTION|>",
    '"tool_name": ',
    "<|content_invoke_tool_json|>",
    "<|message_model|>",
    "<|end_message|>",
    '"args": ',
    "<|tool_call|>",
    "<|tool_calls|>",
    "{'name': 'f'",
    "'arguments': ",
    "<minimax:tool_call>",
    '<invoke name="f">',
    '<parameter name="a">',
    "</invoke>",
    "</minimax:tool_call>",
    "<\uff5ctool_calls_begin\uff5c>",
    "<\uff5ctool_call_begin\uff5c>function<\uff5ctool_sep\uff5c>",
    '<steptml:invoke name="f">',
    '<steptml:parameter name="a">',
    "</steptml:parameter>",
    "</steptml:invoke>",
    "<\uff5cDSML\uff5cfunction_calls>",
    "<\uff5cDSML\uff5ctool_calls>",
    '<\uff5cDSML\uff5cinvoke name="f">',
    '<\uff5cDSML\uff5cparameter name="a" string="false">',
    "</\uff5cDSML\uff5cinvoke>",
    "<tool_calls>",
    "<tool_sep>",
    "</tool_calls>",
    "<seed:tool_call>",
    "</seed:tool_call>",
    "<|open|>tools<|sep|>",
    '<|open|>call tool="f"<|sep|>',
    '<|open|>argument key="a" type="integer"<|sep|>',
    "<|close|>argument<|sep|>",
    "<|close|>call<|sep|>",
    "<|open|>response<|sep|>",
    "<|open|>",
    "<|start|>assistant",
    "<|channel|>commentary to=functions.f",
    "<|constrain|>json",
    "<|message|>",
    "<|call|>",
    "<|end|>",
    "<iquest_tool_call>",
    "</iquest_tool_call>",
    "<tool_calls:opensource>",
    "<tool_call:opensource>",
    "<arg_key:opensource>",
    "</arg_key:opensource>",
    "<arg_value:opensource>",
    "</arg_value:opensource>",
    "</tool_call:opensource>",
    "<\uff5cDSML\uff5c calls>",
    '<\uff5cDSML\uff5c invoke name="f">',
    '<\uff5cDSML\uff5c parameter name="a" string="true">',
    "</\uff5cDSML\uff5c parameter>",
    "</\uff5cDSML\uff5c invoke>",
    "<|tool_call_start|>",
    "<function_calls>",
    "</function_calls>",
    "f(a=1)\n",
    "<TOOLCALL>",
    "</TOOLCALL>",
    "<|tool_call>",
    "call:f{",
    "a:",
    GEMMA4_QUOTE,
    "<tool_call|>",
    "<start_function_call>",
    "<escape>",
    "<end_function_call>",
    M3,
    f"{M3}<tool_call>",
    f'{M3}<invoke name="f">',
    f"{M3}<a>",
    f"{M3}</a>",
    f"{M3}</invoke>",
    f"{M3}</tool_call>",
    "<a>",
    "</a>",
]
garbage = st.lists(st.sampled_from(MARKUP), max_size=14).map("".join)


FORMATS = sorted(TOOL_CALL_FORMATS)
_INKLING_CONTROL = (
    "<|message_model|>",
    "<|content_invoke_tool_json|>",
    "<|content_invoke_tool_text|>",
    "<|content_text|>",
    "<|content_thinking|>",
    "<|end_message|>",
    "<|content_model_end_sampling|>",
)
# What each format drops from content although it is not a call: answer framing.
FRAMING = {
    "cohere": re.compile(r"<\|(?:START|END)_(?:RESPONSE|TEXT)\|>"),
    "kimi_k3": re.compile(r"<\|(?:open|close)\|>\s*(?:response|message)\s*<\|sep\|>"),
    # A header runs from <|message_model|> to the next control token (or the end).
    "inkling": re.compile(
        r"<\|message_model\|>(?:(?!"
        + "|".join(map(re.escape, _INKLING_CONTROL))
        + r").)*|<\|content_text\|>|<\|content_thinking\|>|<\|end_message\|>"
        r"|<\|content_model_end_sampling\|>",
        re.DOTALL,
    ),
}


def _unframed(parser_name: str, text: str) -> str:
    framing = FRAMING.get(parser_name)
    return text if framing is None else framing.sub("", text)


@settings(max_examples=500, deadline=None, database=None)
@given(parser_name=st.sampled_from(FORMATS), text=garbage, cuts=st.lists(st.integers(0, 100_000), max_size=8))
def test_markup_soup_is_chunking_independent_and_loses_nothing(parser_name, text, cuts) -> None:
    whole = _run(parser_name, [text])
    assert _run(parser_name, _chunks(text, cuts)) == whole
    content, parsed = whole
    if not parsed:
        assert content == _unframed(parser_name, text)  # nothing was a call, so all of it is content
    for call in parsed:
        assert call.name and call.arguments_json  # never an empty name or arguments


@FUZZ
@given(parser_name=st.sampled_from(FORMATS), text=st.text(max_size=60), cuts=st.lists(st.integers(0, 1000), max_size=8))
def test_arbitrary_text_without_calls_is_content_unchanged(parser_name, text, cuts) -> None:
    content, parsed = _run(parser_name, _chunks(text, cuts))
    assume(not parsed)
    assert content == _unframed(parser_name, text)


# MiniMax M3: arguments as an element tree, with a schema that says what every leaf is (a tree
# alone cannot tell the string "1" from the number 1, or a one-item array from an object).
_M3_LEAVES = {
    "string": strings,
    "integer": st.integers(-(10**6), 10**6),
    "boolean": st.booleans(),
}
_m3_leaf = st.sampled_from(sorted(_M3_LEAVES)).flatmap(lambda kind: _M3_LEAVES[kind].map(lambda v: (v, {"type": kind})))
_m3_array = st.sampled_from(sorted(_M3_LEAVES)).flatmap(
    lambda kind: st.lists(_M3_LEAVES[kind], max_size=3).map(lambda vs: (vs, {"type": "array", "items": {"type": kind}}))
)
_m3_typed = st.recursive(
    st.one_of(_m3_leaf, _m3_array),
    lambda inner: st.dictionaries(keys, inner, max_size=3).map(
        lambda d: (
            {k: v for k, (v, _) in d.items()},
            {"type": "object", "properties": {k: s for k, (_, s) in d.items()}},
        )
    ),
    max_leaves=6,
)
_m3_calls = st.lists(st.tuples(names, st.dictionaries(keys, _m3_typed, max_size=4)), min_size=1, max_size=3)


def _m3_element(name: str, value: Any, ns: str) -> str:
    if isinstance(value, dict):
        body = "".join(_m3_element(k, v, ns) for k, v in value.items())
    elif isinstance(value, list):
        body = "".join(_m3_element("item", v, ns) for v in value)
    else:
        body = _bare(value).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return f"{ns}<{name}>{body}{ns}</{name}>"


def _m3(cs, ns: str) -> str:
    invokes = "\n".join(
        f'{ns}<invoke name="{n}">' + "".join(_m3_element(k, v, ns) for k, (v, _) in a.items()) + f"{ns}</invoke>"
        for n, a in cs
    )
    return f"{ns}<tool_call>\n{invokes}\n{ns}</tool_call>"


@FUZZ
@given(
    cs=_m3_calls,
    separator=st.sampled_from([M3, ""]),
    before=prose,
    after=prose,
    cuts=st.lists(st.integers(0, 100_000), max_size=10),
)
def test_minimax_m3_trees_parse_back_under_any_chunking(cs, separator, before, after, cuts) -> None:
    assume(len({n for n, _ in cs}) == len(cs))  # a name's schema must be its own
    tools = [
        {
            "type": "function",
            "function": {"name": n, "parameters": {"type": "object", "properties": {k: s for k, (_, s) in a.items()}}},
        }
        for n, a in cs
    ]
    text = before + _m3(cs, separator) + after
    whole = _run("minimax_m3", [text], tools)
    content, parsed = whole
    assert content == before.rstrip() + after.lstrip()
    assert [(c.name, json.loads(c.arguments_json)) for c in parsed] == [
        (n, {k: v for k, (v, _) in a.items()}) for n, a in cs
    ]
    assert _run("minimax_m3", _chunks(text, cuts), tools) == whole
