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
    (
        "kimi_k2",
        ("<|tool_calls_section_begin|><|tool_call_begin|>bad id<|tool_call_argument_begin|>{}<|tool_call_end|>"),
    ),
    ("glm45", "<tool_call>I think that\n</tool_call>"),
    ("json", '{"answer": 42} is the JSON you asked for'),
    ("json", "[1, 2, 3]"),
    ("cohere", "<|START_ACTION|>not json<|END_ACTION|>"),
    ("cohere", '<|START_ACTION|>{"tool_name": 7}<|END_ACTION|>'),
    ("inkling", '<|content_invoke_tool_json|>{"args": {}} then text'),  # no name
    ("granite", "<|tool_call|>call me maybe"),
    ("sarashina", "[{'tool': 'x'}]"),
    ("sarashina", "<|tool_calls|>[not python"),
    ("minimax_m2", '<minimax:tool_call>\n<invoke nom="f">\n</invoke>\n</minimax:tool_call>'),
    ("step3", "<｜tool_calls_begin｜><｜tool_call_begin｜>python<｜tool_sep｜>print(1)<｜tool_call_end｜>"),
    ("deepseek_v32", "<｜DSML｜function_calls>\n<｜DSML｜invoke>\n</｜DSML｜invoke>"),
    ("deepseek_v4", "<｜DSML｜tool_calls>prose</｜DSML｜tool_calls>"),
    ("hunyuan", "<tool_calls><tool_call>two words<tool_sep></tool_call></tool_calls>"),
    ("hunyuan", "<tool_callsign> is not markup"),
    ("hunyuan", "<tool_calls></tool_calls>"),  # a section with no call (found by the fuzz test)
    ("hy4", "before <tool_calls:opensource>\n</tool_calls:opensource> after"),
    ("seed_oss", "<seed:tool_call>\nnot a function\n</seed:tool_call>"),
    ("kimi_k3", '<|open|>tools<|sep|><|open|>argument key="a"<|sep|>1<|close|>argument<|sep|>'),
    ("kimi_k3", "<|open|>think<|sep|>a channel that is not framing<|close|>think<|sep|>"),
    ("gpt_oss", "<|channel|>commentary to=python<|message|>print('hi')<|call|>"),  # not JSON
    ("gpt_oss", "<|channel|>final<|message|>Just an answer.<|return|>"),  # no recipient
    ("iquest", "<iquest_tool_call>two words</iquest_tool_call>"),
    ("hy4", "<tool_calls:opensource><tool_call:opensource>get_weather and more</tool_calls:opensource>"),
    ("deepseek_v41", "<\uff5cDSML\uff5c calls>prose</\uff5cDSML\uff5c calls>"),
    ("lfm2_5", "<|tool_call_start|>not python<|tool_call_end|>"),
    ("olmo3", "<function_calls>\nI would call a function here.\n</function_calls>"),
    ("olmo3", "get_weather(city='Paris') outside the block is prose"),
    ("llama_nemotron", "<TOOLCALL>no calls here</TOOLCALL>"),
    ("llama_nemotron", '[{"name": "get_weather", "arguments": {}}] without the tag'),
    ("gemma4", "<|tool_call>get_weather(city='Paris')<tool_call|>"),  # no `call:`
    ("gemma4", '<|tool_call>call:two words{a:<|"|>x<|"|>}<tool_call|>'),
    ("gemma4", "<|tool_call>call:f(a=1)<tool_call|>"),  # no `{`
    ("function_gemma", "<start_function_call>I would call a tool<end_function_call>"),
    ("minimax_m3", "]<]minimax[>[<tool_call>\ngarbage\n]<]minimax[>[</tool_call>"),
    ("minimax_m3", ']<]minimax[>[ a separator in prose, and ]<]minimax[>[<invoke name="f"> outside a block'),
    ("minimax_m3", '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'),  # Qwen's markup, not M3's
]


@pytest.mark.parametrize(("parser_name", "text"), NOT_A_CALL)
def test_malformed_markup_stays_content_byte_for_byte(parser_name: str, text: str) -> None:
    parser = tool_call_parser(parser_name)
    assert parser.parse_complete(text) == (text, [])
    streamed = tool_call_parser(parser_name)
    assert assemble([*(streamed.feed(c) for c in text), streamed.finish()]) == (text, [])


@pytest.mark.parametrize(
    ("parser_name", "text"),
    [
        ("hermes", "<tool_call>hello</tool_call>"),
        ("mistral", "[TOOL_CALLS] nothing"),
        ("glm45", "<tool_call>I think\n"),
    ],
)
def test_markup_left_in_content_is_reported(parser_name: str, text: str) -> None:
    parser = tool_call_parser(parser_name)
    parser.parse_complete(text)
    assert any("kept as content" in a for a in parser.anomalies)


def test_plain_json_answers_are_not_anomalies() -> None:
    parser = tool_call_parser("llama3_json")
    parser.parse_complete('{"answer": 42}')
    assert parser.anomalies == []


CUT_OFF = [
    ("hermes", 'Sure.<tool_call>{"name": "write", "arguments": {"text": "half of it', '{"text": "half of it', False),
    ("llama3_json", '{"name": "write", "parameters": {"n": [1, 2', '{"n": [1, 2', False),
    ("mistral", '[TOOL_CALLS]write[ARGS]{"text": "ab', '{"text": "ab', False),
    ("deepseek_v31", f'{DS_CALLS_BEGIN}{DS_CALL_BEGIN}write{DS_SEP}{{"a": 1', '{"a": 1', False),
    (
        "kimi_k2",
        ('<|tool_calls_section_begin|><|tool_call_begin|>functions.write:0<|tool_call_argument_begin|>{"a"'),
        '{"a"',
        False,
    ),
    # Formats whose arguments the parser writes itself stay valid JSON.
    (
        "qwen3_coder",
        "<tool_call>\n<function=write>\n<parameter=text>\nhalf of it\n</para",
        '{"text": "half of it"}',
        True,
    ),
    ("glm45", "<tool_call>write\n<arg_key>text</arg_key>\n<arg_value>half", '{"text": "half"}', True),
    ("pythonic", "[write(a=1, text='half", '{"a": 1}', True),
    ("cohere", '<|START_ACTION|>[{"tool_name": "write", "parameters": {"t": "ab', '{"t": "ab', False),
    ("inkling", '<|content_invoke_tool_json|>{"name": "write", "args": {"t": [1', '{"t": [1', False),
    ("gpt_oss", '<|channel|>commentary to=functions.write <|constrain|>json<|message|>{"t": "a', '{"t": "a', False),
    (
        "deepseek_v32",
        ('<｜DSML｜function_calls>\n<｜DSML｜invoke name="write">\n<｜DSML｜parameter name="t" string="true">hal'),
        '{"t": "hal"}',
        True,
    ),
    (
        "minimax_m2",
        '<minimax:tool_call>\n<invoke name="write">\n<parameter name="t">half &am',
        '{"t": "half &am"}',
        True,
    ),
    (
        "kimi_k3",
        (
            '<|open|>tools<|sep|><|open|>call tool="write" index="1"<|sep|><|open|>argument key="t" '
            'type="string"<|sep|>half'
        ),
        '{"t": "half"}',
        True,
    ),
    ("hunyuan", "<tool_calls><tool_call>write<tool_sep><arg_key>t</arg_key><arg_value>ha", '{"t": "ha"}', True),
    ("iquest", "<iquest_tool_call>write<arg_key>t</arg_key><arg_value>ha", '{"t": "ha"}', True),
    ("olmo3", "<function_calls>\nwrite(a=1, t='ha", '{"a": 1}', True),
    ("llama_nemotron", '<TOOLCALL>[{"name": "write", "arguments": {"t": "ab', '{"t": "ab', False),
    ("gemma4", '<|tool_call>call:write{a:1,t:<|"|>half of {it', '{"a": 1, "t": "half of {it"}', True),
    ("gemma4", "<|tool_call>call:write{o:{n:[1,2", '{"o": {"n": [1, 2]}}', True),
    ("function_gemma", "<start_function_call>call:write{t:<escape>hal", '{"t": "hal"}', True),
    (
        "minimax_m3",
        ']<]minimax[>[<tool_call>\n]<]minimax[>[<invoke name="write">]<]minimax[>[<a>1]<]minimax[>[</a>'
        "]<]minimax[>[<t>half &am",
        '{"a": 1, "t": "half &am"}',
        True,
    ),
]


@pytest.mark.parametrize(("parser_name", "text", "arguments", "valid_json"), CUT_OFF)
def test_a_call_cut_off_by_max_tokens_keeps_what_arrived(parser_name, text, arguments, valid_json) -> None:
    parser = tool_call_parser(parser_name, rng=random.Random(0))
    content, calls = parser.parse_complete(text)
    assert [(c.name, c.arguments_json) for c in calls] == [("write", arguments)]
    assert content in ("", "Sure.")
    assert any("cut off" in a for a in parser.anomalies)
    if valid_json:
        json.loads(calls[0].arguments_json)


def test_a_name_without_arguments_gets_an_empty_object_not_an_empty_string() -> None:
    for parser_name, text in [
        ("hermes", '<tool_call>{"name": "now"}</tool_call>'),
        ("mistral", '[TOOL_CALLS] [{"name": "now"}]'),
        ("qwen3_coder", "<tool_call><function=now></function></tool_call>"),
        ("glm45", "<tool_call>now</tool_call>"),
        ("pythonic", "[now()]"),
        ("cohere", '<|START_ACTION|>{"tool_name": "now"}<|END_ACTION|>'),
        ("sarashina", "[{'name': 'now'}]"),
        ("minimax_m2", '<minimax:tool_call><invoke name="now"></invoke></minimax:tool_call>'),
        (
            "deepseek_v32",
            ('<｜DSML｜function_calls><｜DSML｜invoke name="now"></｜DSML｜invoke></｜DSML｜function_calls>'),
        ),
        ("kimi_k3", '<|open|>tools<|sep|><|open|>call tool="now"<|sep|><|close|>call<|sep|>'),
        ("gpt_oss", "<|channel|>commentary to=functions.now<|message|><|call|>"),
        ("hunyuan", "<tool_calls><tool_call>now<tool_sep></tool_call></tool_calls>"),
        ("gemma4", "<|tool_call>call:now{}<tool_call|>"),
        ("minimax_m3", '<tool_call><invoke name="now"></invoke></tool_call>'),
    ]:
        calls = tool_call_parser(parser_name).parse_complete(text)[1]
        assert [(c.name, c.arguments_json) for c in calls] == [("now", "{}")], parser_name


def test_calls_to_tools_not_in_the_request_are_still_reported() -> None:
    tools = [{"type": "function", "function": {"name": "known", "parameters": {}}}]
    calls = tool_call_parser("hermes", tools).parse_complete(
        '<tool_call>{"name": "invented", "arguments": {"x": 1}}</tool_call>'
    )[1]
    assert [(c.name, c.arguments_json) for c in calls] == [("invented", '{"x": 1}')]


def test_junk_inside_a_committed_call_is_skipped_and_reported() -> None:
    parser = tool_call_parser("glm45")
    content, calls = parser.parse_complete(
        "<tool_call>f\n<arg_key>a</arg_key>junk<arg_value>1</arg_value>\n?!\n"
        "<arg_key>b</arg_key><arg_value>x</arg_value></tool_call>after"
    )
    assert (content, [(c.name, json.loads(c.arguments_json)) for c in calls]) == ("after", [("f", {"a": 1, "b": "x"})])
    assert sum("junk" in a for a in parser.anomalies) == 2


def test_hermes_forgives_a_missing_end_tag_between_calls() -> None:
    calls = tool_call_parser("hermes").parse_complete(
        '<tool_call>{"name": "f", "arguments": {}}\n<tool_call>{"name": "g", "arguments": {}}</tool_call>'
    )[1]
    assert [c.name for c in calls] == ["f", "g"]


def test_qwen3_coder_parameter_closed_by_the_next_tag() -> None:
    calls = tool_call_parser("qwen3_coder").parse_complete(
        "<tool_call>\n<function=f>\n<parameter=a>\nx\n<parameter=b>\ny\n</function>\n</tool_call>"
    )[1]
    assert json.loads(calls[0].arguments_json) == {"a": "x", "b": "y"}


@pytest.mark.parametrize(
    ("types", "raw", "expected"),
    [
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
    ],
)
def test_qwen3_coder_types_values_by_the_tool_schema(types, raw, expected) -> None:
    tools = [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"v": types}}}}
    ]
    text = f"<tool_call>\n<function=f>\n<parameter=v>\n{raw}\n</parameter>\n</function>\n"
    calls = tool_call_parser("qwen3_coder", tools).parse_complete(text)[1]
    assert json.loads(calls[0].arguments_json) == {"v": expected}


def test_glm45_reads_untyped_values_as_json_when_they_are_json() -> None:
    calls = tool_call_parser("glm45").parse_complete(
        "<tool_call>f\n<arg_key>n</arg_key>\n<arg_value>3</arg_value>\n<arg_key>s</arg_key>\n"
        "<arg_value>hello</arg_value>\n<arg_key>l</arg_key>\n<arg_value>[1, 2]</arg_value>\n"
        "</tool_call>"
    )[1]
    assert json.loads(calls[0].arguments_json) == {"n": 3, "s": "hello", "l": [1, 2]}


SCHEMA_TYPED = [
    # (format, text with an argument "v" written as bare text "RAW")
    (
        "minimax_m2",
        '<minimax:tool_call><invoke name="f"><parameter name="v">RAW</parameter></invoke></minimax:tool_call>',
    ),
    (
        "step3",
        (
            '<｜tool_calls_begin｜><｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke name="f">'
            '<steptml:parameter name="v">RAW</steptml:parameter></steptml:invoke><｜tool_call_end｜><｜tool_calls_end｜>'
        ),
    ),
    (
        "hunyuan",
        "<tool_calls><tool_call>f<tool_sep><arg_key>v</arg_key><arg_value>RAW</arg_value></tool_call></tool_calls>",
    ),
    ("seed_oss", "<seed:tool_call><function=f><parameter=v>RAW</parameter></function></seed:tool_call>"),
    (
        "deepseek_v32",
        (
            '<｜DSML｜function_calls><｜DSML｜invoke name="f"><｜DSML｜parameter name="v">RAW'
            "</｜DSML｜parameter></｜DSML｜invoke></｜DSML｜function_calls>"
        ),
    ),
]


@pytest.mark.parametrize(("parser_name", "template"), SCHEMA_TYPED, ids=[c[0] for c in SCHEMA_TYPED])
@pytest.mark.parametrize(
    ("types", "raw", "expected"),
    [
        ({"type": "integer"}, "42", 42),
        ({"type": "number"}, "2.5", 2.5),
        ({"type": "boolean"}, "true", True),
        ({"type": "string"}, "42", "42"),  # a number-looking string stays a string
        ({"type": "array"}, "[1, 2]", [1, 2]),
        ({"type": "object"}, '{"k": 1}', {"k": 1}),
        ({"type": "integer"}, "many", "many"),  # does not fit: kept as text, not dropped
    ],
)
def test_xml_style_values_are_typed_by_the_tool_schema(parser_name, template, types, raw, expected) -> None:
    tools = [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"v": types}}}}
    ]
    text = template.replace("RAW", raw)
    calls = tool_call_parser(parser_name, tools).parse_complete(text)[1]
    assert json.loads(calls[0].arguments_json) == {"v": expected}
    streamed = tool_call_parser(parser_name, tools)
    assert assemble([*(streamed.feed(c) for c in text), streamed.finish()])[1][0].arguments_json == (
        calls[0].arguments_json
    )


def test_markup_that_declares_types_wins_over_guessing() -> None:
    """DSML's `string=` and Kimi K3's `type=` say what a value is, schema or not."""
    dsml = tool_call_parser("deepseek_v32").parse_complete(
        '<｜DSML｜function_calls><｜DSML｜invoke name="f"><｜DSML｜parameter name="a" string="true">7'
        '</｜DSML｜parameter><｜DSML｜parameter name="b" string="false">7</｜DSML｜parameter>'
        '<｜DSML｜parameter name="c" string="false">not json</｜DSML｜parameter></｜DSML｜invoke>'
        "</｜DSML｜function_calls>"
    )[1]
    assert json.loads(dsml[0].arguments_json) == {"a": "7", "b": 7, "c": "not json"}
    k3 = tool_call_parser("kimi_k3").parse_complete(
        '<|open|>tools<|sep|><|open|>call tool="f"<|sep|><|open|>argument key="a" type="string"<|sep|>[1]'
        '<|close|>argument<|sep|><|open|>argument key="b" type="array"<|sep|>[1]<|close|>argument<|sep|>'
        "<|close|>call<|sep|><|close|>tools<|sep|>"
    )[1]
    assert json.loads(k3[0].arguments_json) == {"a": "[1]", "b": [1]}


def test_minimax_untyped_values_are_read_as_minimax_reads_them() -> None:
    calls = tool_call_parser("minimax_m2").parse_complete(
        '<minimax:tool_call><invoke name="f"><parameter name="a">True</parameter><parameter name="b">None'
        '</parameter><parameter name="c">-3</parameter><parameter name="d">[1, 2]</parameter>'
        '<parameter name="e">&quot;x&quot; &apos;y&apos;</parameter></invoke></minimax:tool_call>'
    )[1]
    assert json.loads(calls[0].arguments_json) == {"a": True, "b": None, "c": -3, "d": "[1, 2]", "e": "\"x\" 'y'"}


def test_an_escape_split_across_deltas_is_decoded_whole() -> None:
    parser = tool_call_parser("minimax_m2")
    deltas = [
        parser.feed(c)
        for c in [
            '<minimax:tool_call><invoke name="f"><parameter name="t">a &a',
            "mp",
            "; b",
            "</parameter></invoke></minimax:tool_call>",
        ]
    ]
    deltas.append(parser.finish())
    assert json.loads(assemble(deltas)[1][0].arguments_json) == {"t": "a & b"}


def test_framing_around_the_answer_is_not_content() -> None:
    assert tool_call_parser("cohere").parse_complete("<|START_RESPONSE|>Hi.<|END_RESPONSE|>") == ("Hi.", [])
    assert tool_call_parser("kimi_k3").parse_complete(
        "<|open|> response <|sep|>Hi.<|close|>response<|sep|><|close|>message<|sep|>"
    ) == ("Hi.", [])
    assert tool_call_parser("inkling").parse_complete(
        "<|message_model|>assistant<|content_text|>Hi.<|end_message|>"
    ) == ("Hi.", [])


def test_inkling_text_mode_invocations_stay_content_and_are_reported() -> None:
    parser = tool_call_parser("inkling")
    text = "<|content_invoke_tool_text|>search rust<|end_message|>"
    assert parser.parse_complete(text) == ("<|content_invoke_tool_text|>search rust", [])
    assert any("text-mode" in a for a in parser.anomalies)


def test_harmony_calls_end_at_the_stream_end_without_an_anomaly() -> None:
    """`<|call|>` is a stop token the engine drops: no terminator is the normal case."""
    parser = tool_call_parser("gpt_oss")
    calls = parser.parse_complete('<|channel|>commentary to=functions.f <|constrain|>json<|message|>{"a": 1}')[1]
    assert [(c.name, c.arguments_json) for c in calls] == [("f", '{"a": 1}')]
    assert parser.anomalies == []


def test_harmony_builtin_recipients_are_reported_under_their_full_name() -> None:
    calls = tool_call_parser("gpt_oss").parse_complete(
        '<|channel|>commentary to=browser.search <|constrain|>json<|message|>{"query": "x"}<|call|>'
    )[1]
    assert [c.name for c in calls] == ["browser.search"]


def test_gemma_arguments_broken_after_the_commit_end_the_call_and_skip_to_its_end() -> None:
    parser = tool_call_parser("gemma4")
    content, calls = parser.parse_complete(
        '<|tool_call>call:f{a:<|"|>x<|"|> b:1}<tool_call|>after<|tool_call>call:g{}<tool_call|>'
    )
    assert (content, [(c.name, json.loads(c.arguments_json)) for c in calls]) == (
        "after",
        [("f", {"a": "x"}), ("g", {})],
    )
    assert any("malformed" in a for a in parser.anomalies)


def test_gemma_values_are_typed_by_their_syntax_unless_the_schema_rules_the_type_out() -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "f",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "code": {"type": "string"},
                        "n": {"type": "integer"},
                        "ok": {"type": "boolean"},
                        "tags": {"type": "array", "items": {"type": "integer"}},
                        "deep": {"type": "object", "properties": {"zip": {"type": "string"}}},
                    },
                },
            },
        }
    ]
    text = (
        '<|tool_call>call:f{code:007,n:<|"|>12<|"|>,ok:<|"|>true<|"|>,tags:[<|"|>1<|"|>,2],'
        'deep:{zip:02139},other:<|"|>12<|"|>,word:maybe}<tool_call|>'
    )
    calls = tool_call_parser("gemma4", tools).parse_complete(text)[1]
    assert json.loads(calls[0].arguments_json) == {
        "code": "007",
        "n": 12,
        "ok": True,
        "tags": [1, 2],
        "deep": {"zip": "02139"},
        "other": "12",  # quoted and untyped: a string
        "word": "maybe",  # bare text that is no literal: a string
    }


def test_gemma_strings_stream_as_they_arrive() -> None:
    parser = tool_call_parser("gemma4", rng=random.Random(1))
    first = parser.feed('<|tool_call>call:write{text:<|"|>hello ')
    second = parser.feed('"world"')
    assert [(c.name, c.arguments) for c in first.calls] == [("write", '{"text": "hello ')]
    assert [c.arguments for c in second.calls] == ['\\"world\\"']


def test_minimax_m3_broken_tree_ends_the_call_with_the_arguments_read() -> None:
    ns = "]<]minimax[>["
    parser = tool_call_parser("minimax_m3")
    content, calls = parser.parse_complete(
        f'{ns}<tool_call>\n{ns}<invoke name="f">{ns}<a>1{ns}</a>{ns}<b>2{ns}</c>{ns}</invoke>\n'
        f'{ns}<invoke name="g">{ns}<city>Oslo{ns}</city>{ns}</invoke>\n{ns}</tool_call>Done.'
    )
    assert (content, [(c.name, json.loads(c.arguments_json)) for c in calls]) == (
        "Done.",
        [("f", {"a": 1}), ("g", {"city": "Oslo"})],
    )
    assert any("dropped" in a for a in parser.anomalies)


def test_minimax_m3_types_leaves_by_the_schema_followed_into_the_tree() -> None:
    ns = "]<]minimax[>["
    tools = [
        {
            "type": "function",
            "function": {
                "name": "create_task",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "meta": {"type": "object", "properties": {"code": {"type": "string"}}},
                        "labels": {"type": "array", "items": {"type": "string"}},
                        "empty": {"type": "array"},
                    },
                },
            },
        }
    ]
    text = (
        f'{ns}<tool_call>{ns}<invoke name="create_task">{ns}<meta>{ns}<code>007{ns}</code>{ns}</meta>'
        f"{ns}<labels>{ns}<item>1{ns}</item>{ns}<item>2{ns}</item>{ns}</labels>{ns}<empty>{ns}</empty>"
        f"{ns}<note>see{ns}<code>7{ns}</code>{ns}</note>{ns}</invoke>{ns}</tool_call>"
    )
    calls = tool_call_parser("minimax_m3", tools).parse_complete(text)[1]
    assert json.loads(calls[0].arguments_json) == {
        "meta": {"code": "007"},
        "labels": ["1", "2"],
        "empty": [],
        "note": {"code": 7, "$text": "see"},  # untyped; text beside children is kept, as smg does
    }
