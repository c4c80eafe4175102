"""Every parser name smg 1.13, SGLang, vLLM and Dynamo use is accepted and parses its format, and
every parser declares what its caller reads (`ToolParser`, `requires_special_tokens`)."""

from __future__ import annotations

import json
import random

import pytest

from trio_direct.parsers.reasoning import KNOWN_REASONING_PARSERS, ReasoningParser, reasoning_parser
from trio_direct.parsers.selection import skip_special_tokens
from trio_direct.parsers.tools import (
    KNOWN_TOOL_CALL_PARSERS,
    TOOL_CALL_FORMATS,
    ToolParser,
    tool_call_parser,
)
from trio_direct.parsers.tools.forced import NamedToolCallParser, RequiredToolCallsParser

# The names smg's factories register (`crates/tool_parser/src/factory.rs`,
# `crates/reasoning_parser/src/factory.rs`), as the issue lists them.
SMG_TOOL_CALL_NAMES = (
    "passthrough",
    "json",
    "mistral",
    "qwen",
    "qwen_xml",
    "qwen_coder",
    "nemotron",
    "pythonic",
    "llama",
    "deepseek",
    "deepseek31",
    "deepseek32",
    "deepseek_v4",
    "glm45_moe",
    "glm47_moe",
    "step3",
    "sarashina",
    "kimik2",
    "kimi_k3",
    "inkling",
    "minimax_m2",
    "cohere",
)
SMG_REASONING_NAMES = (
    "base",
    "passthrough",
    "deepseek_r1",
    "qwen3",
    "qwen3_thinking",
    "kimi",
    "glm45",
    "step3",
    "minimax",
    "cohere_cmd",
    "nano_v3",
    "inkling",
    "deepseek_v31",
    "deepseek_v4",
    "kimi_k25",
    "kimi_thinking",
    "kimi_k3",
)
# Every name smg 1.13's CLI accepts (`smg launch --help`: the choices of `--tool-call-parser` and
# `--reasoning-parser`, from `smg_rs.get_available_tool_call_parsers()` /
# `get_available_reasoning_parsers()`): its legacy parsers' names and its Symphony tables' names.
SMG_113_CLI_TOOL_CALL_NAMES = (
    "cohere", "deepseek", "deepseek31", "deepseek32", "deepseek_v4", "deepseek_v4.1", "deepseek_v41", "dots3",
    "function_gemma", "gemma4", "glm", "glm4", "glm45_moe", "glm47_moe", "hf", "hy4", "hy_v4", "inkling",
    "iquest", "json", "k2_horizon", "kimi_k3", "kimik2", "lfm2.5", "ling", "llama", "llama_nemotron", "minicpm5",
    "minimax_m2", "minimax_m3", "mistral", "mistral_v13", "nemotron", "olmo3", "passthrough", "plain", "pythonic",
    "qwen", "qwen2.5", "qwen3", "qwen3_tagged", "qwen3_tagged_direct", "qwen_coder", "qwen_xml", "sarashina",
    "seed_oss", "step3", "xlam",
)  # fmt: skip
SMG_113_CLI_REASONING_NAMES = (
    "base", "cohere_cmd", "deepseek_r1", "deepseek_v31", "deepseek_v4", "deepseek_v4.1", "deepseek_v41", "dots3",
    "function_gemma", "gemma4", "glm", "glm4", "glm45", "hf", "hy4", "hy_v4", "inkling", "iquest", "json",
    "k2_horizon", "kimi", "kimi_k25", "kimi_k3", "kimi_thinking", "lfm2.5", "ling", "llama_nemotron", "minicpm5",
    "minimax", "minimax_m2", "minimax_m3", "mistral_v13", "nano_v3", "olmo3", "passthrough", "plain", "qwen2.5",
    "qwen3", "qwen3_tagged", "qwen3_tagged_direct", "qwen3_thinking", "seed_oss", "step3", "xlam",
)  # fmt: skip
# smg 1.13 names trio-direct does not accept, and why (docs/tools-and-reasoning.md says the same).
NOT_ACCEPTED = {
    "hf": "not a format: smg reads the output with the model's own Hugging Face response template",
    "dots3": "smg's table is not published; its call markup is unknown",
    "minicpm5": "smg's table is not published; its call markup is unknown",
    "k2_horizon": "smg's table is not published; its call markup is unknown",
}
NOT_ACCEPTED_TOOL_CALL = dict(NOT_ACCEPTED)
# SGLang's `FunctionCallParser.ToolCallParserEnum` keys for the formats trio-direct parses.
SGLANG_TOOL_CALL_NAMES = (
    "cohere_command4",
    "deepseekv3",
    "deepseekv31",
    "deepseekv32",
    "deepseekv4",
    "glm",
    "glm45",
    "glm47",
    "gpt-oss",
    "kimi_k2",
    "kimi_k3",
    "llama3",
    "mistral",
    "pythonic",
    "qwen",
    "qwen25",
    "qwen3_coder",
    "step3",
    "step3p5",
    "minimax-m2",
    "hermes",
    "hunyuan",
    "inkling",
)
# SGLang's `ReasoningParser.DetectorMap` keys for the formats trio-direct parses.
SGLANG_REASONING_NAMES = (
    "deepseek-r1",
    "deepseek-v3",
    "deepseek-v4",
    "glm45",
    "hunyuan",
    "gpt-oss",
    "kimi",
    "kimi_k2",
    "kimi_k3",
    "mimo",
    "poolside_v1",
    "qwen3",
    "qwen3-thinking",
    "minimax",
    "minimax-append-think",
    "step3",
    "step3p5",
    "mistral",
    "nemotron_3",
    "interns1",
    "inkling",
    "cohere_command4",
    "telechat4",
)
OTHER_TOOL_CALL_NAMES = (
    "functiongemma",  # vLLM
    "harmony",
    "deepseek_v3_2",
    "deepseek_v3_1",
    "llama3_json",
    "qwen3_xml",
    "seed_oss",
    "granite",
    "openai",
    "llama4_pythonic",
)

D = "\uff5cDSML\uff5c"
# One call to get_weather(city="Paris") in each format's markup, after "Sure." where it may follow prose.
ONE_CALL = {
    "passthrough": None,
    "json": '{"name": "get_weather", "arguments": {"city": "Paris"}}',
    "hermes": 'Sure.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    "qwen3_coder": "Sure.<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n"
    "</tool_call>",
    "seed_oss": "Sure.<seed:tool_call>\n<function=get_weather>\n<parameter=city>Paris</parameter>\n</function>\n"
    "</seed:tool_call>",
    "llama3_json": 'Sure.<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}',
    "mistral": 'Sure.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}',
    "pythonic": 'Sure.<|python_start|>[get_weather(city="Paris")]<|python_end|>',
    "deepseek_v3": "Sure.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
    '{"city": "Paris"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
    "deepseek_v31": 'Sure.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}'
    "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
    "deepseek_v32": f'Sure.<{D}function_calls>\n<{D}invoke name="get_weather">\n<{D}parameter name="city" '
    f'string="true">Paris</{D}parameter>\n</{D}invoke>\n</{D}function_calls>',
    "deepseek_v4": f'Sure.<{D}tool_calls>\n<{D}invoke name="get_weather">\n<{D}parameter name="city" '
    f'string="true">Paris</{D}parameter>\n</{D}invoke>\n</{D}tool_calls>',
    "kimi_k2": "Sure.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
    '<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>',
    "kimi_k3": 'Sure.<|open|>tools<|sep|><|open|>call tool="get_weather" index="1"<|sep|><|open|>argument '
    'key="city" type="string"<|sep|>Paris<|close|>argument<|sep|><|close|>call<|sep|><|close|>tools<|sep|>',
    "glm45": "Sure.<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>",
    "step3": "Sure.<｜tool_calls_begin｜><｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke "
    'name="get_weather"><steptml:parameter name="city">Paris</steptml:parameter></steptml:invoke>'
    "<｜tool_call_end｜><｜tool_calls_end｜>",
    "sarashina": "Sure.<|tool_calls|>[{'name': 'get_weather', 'arguments': {'city': 'Paris'}}]",
    "inkling": 'Sure.<|message_model|>get_weather<|content_invoke_tool_json|>{"name": "get_weather", "args": '
    '{"city": "Paris"}}<|end_message|>',
    "minimax_m2": 'Sure.<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Paris</parameter>\n'
    "</invoke>\n</minimax:tool_call>",
    "cohere": 'Sure.<|START_ACTION|>[{"tool_call_id": "0", "tool_name": "get_weather", "parameters": '
    '{"city": "Paris"}}]<|END_ACTION|>',
    "gpt_oss": "Sure.<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
    '{"city": "Paris"}<|call|>',
    "hunyuan": "Sure.<tool_calls>\n<tool_call>get_weather<tool_sep>\n<arg_key>city</arg_key>\n<arg_value>Paris"
    "</arg_value>\n</tool_call>\n</tool_calls>",
    "granite": '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}]',
    "iquest": "Sure.<iquest_tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value>"
    "</iquest_tool_call>",
    "deepseek_v41": 'Sure.<\uff5cDSML\uff5c calls>\n<\uff5cDSML\uff5c invoke name="get_weather">\n<\uff5cDSML\uff5c parameter '
    'name="city" string="true">Paris</\uff5cDSML\uff5c parameter>\n</\uff5cDSML\uff5c invoke>\n</\uff5cDSML\uff5c calls>',
    "lfm2_5": "Sure.<|tool_call_start|>[get_weather(city='Paris')]<|tool_call_end|>",
    "olmo3": 'Sure.<function_calls>\nget_weather(city="Paris")\n</function_calls>',
    "llama_nemotron": 'Sure.<TOOLCALL>[{"name": "get_weather", "arguments": {"city": "Paris"}}]</TOOLCALL>',
    "gemma4": 'Sure.<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|>',
    "function_gemma": "Sure.<start_function_call>call:get_weather{city:<escape>Paris<escape>}<end_function_call>",
    "minimax_m3": (
        'Sure.]<]minimax[>[<tool_call>\n]<]minimax[>[<invoke name="get_weather">]<]minimax[>[<city>Paris'
        "]<]minimax[>[</city>]<]minimax[>[</invoke>\n]<]minimax[>[</tool_call>"
    ),
}
# Hy4 (smg's `hy4` / `hy_v4`) writes Hunyuan's markup without `<tool_sep>`.
HY4_CALL = (
    "Sure.<tool_calls:opensource><tool_call:opensource>get_weather<arg_key:opensource>city</arg_key:opensource>"
    "<arg_value:opensource>Paris</arg_value:opensource></tool_call:opensource></tool_calls:opensource>"
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


def test_every_format_has_a_sample() -> None:
    assert set(ONE_CALL) == set(TOOL_CALL_FORMATS) == set(KNOWN_TOOL_CALL_PARSERS.values())


@pytest.mark.parametrize(
    "name", sorted({*SMG_TOOL_CALL_NAMES, *SGLANG_TOOL_CALL_NAMES, *OTHER_TOOL_CALL_NAMES, *KNOWN_TOOL_CALL_PARSERS})
)
def test_every_tool_call_name_parses_its_format(name: str) -> None:
    parser = tool_call_parser(name, TOOLS, rng=random.Random(0))
    text = HY4_CALL if name in ("hy4", "hy_v4") else ONE_CALL[parser.format]
    if text is None:  # passthrough: everything is content
        assert parser.parse_complete("Sure.<tool_call>x") == ("Sure.<tool_call>x", [])
        return
    content, calls = parser.parse_complete(text)
    assert content == ("" if parser.format in ("json", "granite") else "Sure.")
    assert [(c.name, json.loads(c.arguments_json)) for c in calls] == [("get_weather", {"city": "Paris"})]


# One reasoning section "R" then the answer "C", in each reasoning format's markup.
ONE_THOUGHT = {
    "basic": "<think>R</think>C",
    "deepseek_r1": "R</think>C",
    "step3": "R</think>C",
    "qwen3": "<think>R</think>C",
    "qwen3_thinking": "R</think>C",
    "glm45": "<think>R</think>C",
    "nano_v3": "<think>R</think>C",
    "deepseek_v31": "<think>R</think>C",
    "deepseek_v4": "<think>R</think>C",
    "kimi": "◁think▷R◁/think▷C",
    "kimi_k25": "<think>R</think>C",
    "kimi_thinking": "R</think>C",
    "kimi_k3": "<|open|>think<|sep|>R<|close|>think<|sep|><|open|>response<|sep|>C<|close|>response<|sep|>",
    "minimax": "R</think>C",
    "cohere_cmd": "<|START_THINKING|>R<|END_THINKING|><|START_RESPONSE|>C<|END_RESPONSE|>",
    "cohere_command4": "R<|END_THINKING|><|START_TEXT|>C<|END_TEXT|>",
    "mistral": "[THINK]R[/THINK]C",
    "hunyuan": "<think>R</think>C",
    "seed_oss": "<seed:think>R</seed:think>C",
    "gpt_oss": "<|channel|>analysis<|message|>R<|end|><|start|>assistant<|channel|>final<|message|>C<|return|>",
    "inkling": "<|message_model|><|content_thinking|>R<|end_message|><|message_model|><|content_text|>C"
    "<|end_message|><|content_model_end_sampling|>",
    "minimax_append_think": None,
    "passthrough": None,
    "hy4": "<think:opensource>R</think:opensource>C",
    "deepseek_v41": "<think>R</think>C",
    "minimax_m3": "<mm:think>R</mm:think>]<]minimax[>[C",
    "gemma4": "<|channel>thought\nR<channel|>C",
}


def test_every_reasoning_format_has_a_sample() -> None:
    assert set(ONE_THOUGHT) == set(KNOWN_REASONING_PARSERS.values())


@pytest.mark.parametrize("name", sorted({*SMG_REASONING_NAMES, *SGLANG_REASONING_NAMES, *KNOWN_REASONING_PARSERS}))
def test_every_reasoning_name_parses_its_format(name: str) -> None:
    canonical = KNOWN_REASONING_PARSERS[name.lower().replace("-", "_")]
    parser = reasoning_parser(name)
    text = ONE_THOUGHT[canonical] or "R</think>C"
    deltas = [parser.feed(text), parser.finish()]
    split = ("".join(d.reasoning for d in deltas), "".join(d.content for d in deltas))
    if canonical == "passthrough":
        assert split == ("", text)
    elif canonical == "minimax_append_think":
        assert split == ("", "<think>" + text)
    else:
        assert split == ("R", "C")


def test_tool_parsers_declare_whether_they_need_special_tokens() -> None:
    for name, parser_class in TOOL_CALL_FORMATS.items():
        parser: ToolParser = parser_class(None)
        assert parser.requires_special_tokens is (name != "passthrough"), name
        assert parser.call_count == 0 and parser.anomalies == []
    forced: list[ToolParser] = [NamedToolCallParser("f"), RequiredToolCallsParser()]
    assert [p.requires_special_tokens for p in forced] == [False, False]


def test_forced_parsers_have_the_whole_protocol() -> None:
    required = RequiredToolCallsParser(rng=random.Random(0))
    assert required.feed("not json").calls == []
    assert required.finish().content == "not json" and required.anomalies and required.call_count == 0
    named = NamedToolCallParser("f", rng=random.Random(0))
    named.feed('{"a": 1}')
    assert named.call_count == 1 and named.anomalies == []


def test_reasoning_parsers_whose_markers_are_special_tokens_say_so() -> None:
    special = {"gpt_oss", "inkling", "kimi_k3", "cohere_cmd", "cohere_command4", "mistral", "seed_oss"}
    special |= {"hy4", "minimax_m3", "gemma4"}
    for name in set(KNOWN_REASONING_PARSERS.values()):
        parser = reasoning_parser(name)
        assert isinstance(parser, ReasoningParser)
        assert parser.requires_special_tokens is (name in special), name


def test_the_detokenizer_keeps_special_tokens_when_a_parser_needs_them() -> None:
    harmony = reasoning_parser("gpt_oss")
    qwen = reasoning_parser("qwen3")
    assert skip_special_tokens(True, [None, qwen]) is True
    assert skip_special_tokens(True, [tool_call_parser("hermes"), None]) is False
    assert skip_special_tokens(True, [NamedToolCallParser("f"), harmony]) is False  # gpt-oss reasoning alone
    assert skip_special_tokens(True, [NamedToolCallParser("f"), qwen]) is True
    assert skip_special_tokens(False, [None, None]) is False  # the client asked to keep them


def test_the_docs_list_every_format_with_all_its_names_and_the_counts() -> None:
    from pathlib import Path

    doc = (Path(__file__).parents[2] / "docs" / "tools-and-reasoning.md").read_text()
    rows = {line.split("|")[1].strip().strip("`"): line for line in doc.splitlines() if line.startswith("| `")}
    for known in (KNOWN_TOOL_CALL_PARSERS, KNOWN_REASONING_PARSERS):
        for name, canonical in known.items():
            assert canonical in rows, canonical
    tool_rows = doc.split("## Tool-call formats")[1].split("## Reasoning formats")[0]
    reasoning_rows = doc.split("## Reasoning formats")[1].split("## Special tokens")[0]
    for section, known in ((tool_rows, KNOWN_TOOL_CALL_PARSERS), (reasoning_rows, KNOWN_REASONING_PARSERS)):
        table = {
            line.split("|")[1].strip().strip("`"): line.split("|")[2]
            for line in section.splitlines()
            if line.startswith("| `")
        }
        assert set(table) == set(known.values())
        for name, canonical in known.items():
            assert name in table[canonical].replace("-", "_"), (name, canonical)
    assert f"| tool-call formats | {len(TOOL_CALL_FORMATS)} |" in doc
    assert f"| tool-call names accepted | {len(KNOWN_TOOL_CALL_PARSERS)} |" in doc
    assert f"| reasoning formats | {len(set(KNOWN_REASONING_PARSERS.values()))} |" in doc
    assert f"| reasoning names accepted | {len(KNOWN_REASONING_PARSERS)} |" in doc


def test_every_name_smg_113_accepts_is_accepted_here_or_documented_as_not() -> None:
    from trio_direct.parsers.tools import normalize_parser_name

    for name in SMG_113_CLI_TOOL_CALL_NAMES:
        known = normalize_parser_name(name) in KNOWN_TOOL_CALL_PARSERS
        assert known is (name not in NOT_ACCEPTED_TOOL_CALL), name
    for name in SMG_113_CLI_REASONING_NAMES:
        known = normalize_parser_name(name) in KNOWN_REASONING_PARSERS
        assert known is (name not in NOT_ACCEPTED), name
    assert len(SMG_113_CLI_TOOL_CALL_NAMES) == 48 and len(SMG_113_CLI_REASONING_NAMES) == 44


@pytest.mark.parametrize("name", sorted(set(SMG_113_CLI_TOOL_CALL_NAMES) - set(NOT_ACCEPTED_TOOL_CALL)))
def test_smg_113_tool_call_names_pass_the_flag_and_parse_their_format(name: str) -> None:
    from trio_direct.parsers.selection import select_parsers

    chosen = select_parsers(
        tool_call_flag=name,
        reasoning_flag=None,
        engine_tool_call_parser=None,
        engine_reasoning_parser=None,
        model_path=None,
        served_model_name=None,
    )
    assert chosen.tool_call_parser == KNOWN_TOOL_CALL_PARSERS[name.lower().replace("-", "_")]
    test_every_tool_call_name_parses_its_format(name)


@pytest.mark.parametrize("name", sorted(set(SMG_113_CLI_REASONING_NAMES) - set(NOT_ACCEPTED)))
def test_smg_113_reasoning_names_pass_the_flag_and_parse_their_format(name: str) -> None:
    from trio_direct.parsers.selection import select_parsers

    chosen = select_parsers(
        tool_call_flag=None,
        reasoning_flag=name,
        engine_tool_call_parser=None,
        engine_reasoning_parser=None,
        model_path=None,
        served_model_name=None,
    )
    assert chosen.reasoning_parser == KNOWN_REASONING_PARSERS[name.lower().replace("-", "_")]
    test_every_reasoning_name_parses_its_format(name)


@pytest.mark.parametrize("name", sorted(NOT_ACCEPTED_TOOL_CALL))
def test_smg_names_we_do_not_parse_are_a_clear_start_up_error(name: str) -> None:
    from trio_direct.parsers.selection import select_parsers

    with pytest.raises(ValueError, match="unknown tool-call parser"):
        select_parsers(
            tool_call_flag=name,
            reasoning_flag=None,
            engine_tool_call_parser=None,
            engine_reasoning_parser=None,
            model_path=None,
            served_model_name=None,
        )
