"""Reasoning parsers split text into reasoning and content the same way however it is chunked.

Golden cases come from the formats' published examples (SGLang's reasoning parser docs and
detector docstrings, the OpenAI harmony guide); the streaming properties check that no cut of
the text into deltas loses, duplicates or reorders text, or leaks a tag.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trio_direct.parsers.reasoning import (
    INKLING_CONTROL_TOKENS,
    KNOWN_REASONING_PARSERS,
    REASONING_FORMATS,
    ReasoningDelta,
    ReasoningParser,
    ThinkTagParser,
    UnknownReasoningParser,
    reasoning_parser,
)

FUZZ = settings(max_examples=250, deadline=None, database=None)

HARMONY = ("<|start|>", "<|channel|>", "<|message|>", "<|constrain|>", "<|end|>", "<|call|>", "<|return|>")
INKLING = INKLING_CONTROL_TOKENS
# Tags each format reacts to (for the hold-back property and for generating texts).
TAGS: dict[str, tuple[str, ...]] = {
    **{
        name: tuple(dict.fromkeys((f.start, f.end, *f.extra_ends, *f.tool_starts, *f.content_drops)))
        for name, f in REASONING_FORMATS.items()
    },
    "gemma4": (REASONING_FORMATS["gemma4"].start, REASONING_FORMATS["gemma4"].end, "thought\n"),
    "gpt_oss": HARMONY,
    "inkling": INKLING,
    "minimax_append_think": (),
    "passthrough": (),
}
# Formats a start tag, an end tag and tool starts describe (the independent reading below).
SIMPLE_TAG_FORMATS = [
    name
    for name, f in REASONING_FORMATS.items()
    if not f.extra_ends and not f.content_drops and name != "gemma4"  # gemma4 also strips a label
]
Config = tuple[str, dict[str, Any]]
CONFIGS: list[Config] = [
    *((name, {}) for name in TAGS),
    ("qwen3", {"enable_thinking": False}),
    ("glm45", {"enable_thinking": False}),
    ("basic", {"force_reasoning": True}),
    ("kimi", {"force_reasoning": True}),
]


def _label(config: Config) -> str:
    name, kwargs = config
    return name + "".join(f",{k}={v}" for k, v in kwargs.items())


def stream(config: Config, chunks: Iterable[str]) -> tuple[str, str]:
    """Feed `chunks` to a fresh parser, finish it, and join what came out."""
    parser = reasoning_parser(config[0], **config[1])
    deltas = [parser.feed(chunk) for chunk in chunks]
    deltas.append(parser.finish())
    return "".join(d.reasoning for d in deltas), "".join(d.content for d in deltas)


def whole(config: Config, text: str) -> tuple[str, str]:
    return stream(config, [text])


def cut(text: str, points: Iterable[int]) -> list[str]:
    bounds = [0, *sorted(points), len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


# --- golden cases ---------------------------------------------------------------------------

TOOL_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
GPT_OSS_CALL = (
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
    '<|message|>{"location":"San Francisco"}<|call|>'
)
GPT_OSS_PREAMBLE_CALL = (
    "<|start|>assistant<|channel|>commentary to=functions.generate_file"
    '<|constrain|>json<|message|>{"template": "basic_html", "path": '
    '"index.html"}<|call|>'
)

GOLDEN: list[tuple[Config, str, str, str]] = [
    # smg 1.13: its gemma4 parser's tests, and its Symphony tables' recorded outputs.
    (("gemma4", {}), "<|channel>thought\nlet me think<channel|>The answer is 4", "let me think", "The answer is 4"),
    (("gemma4", {}), "<|channel>no label here<channel|>done", "no label here", "done"),
    (("gemma4", {}), "<|channel>thou<channel|>answer", "thou", "answer"),
    (("gemma4", {}), "The answer is 4", "", "The answer is 4"),
    (("minimax_m3", {}), "<mm:think>A plan.</mm:think>Hello.", "A plan.", "Hello."),
    (("minimax_m3", {}), "</mm:think>Hello!", "", "Hello!"),
    (
        ("minimax_m3", {}),
        '</mm:think>]<]minimax[>[<tool_call>\n]<]minimax[>[<invoke name="f">',
        "",
        '<tool_call>\n<invoke name="f">',  # the separator is dropped wherever it stands
    ),
    (("hy4", {"force_reasoning": True}), "The user asks.</think:opensource>Sure.", "The user asks.", "Sure."),
    (
        ("hy4", {}),
        "<think:opensource>Call.<tool_calls:opensource><tool_call:opensource>f",
        "Call.",
        "<tool_calls:opensource><tool_call:opensource>f",
    ),
    (
        ("deepseek_v41", {"force_reasoning": True}),
        "Let me call.<\uff5cDSML\uff5c calls>\n",
        "Let me call.",
        "<\uff5cDSML\uff5c calls>\n",
    ),
    (("glm", {"force_reasoning": True}), "Step 1: read.</think>Here it is.", "Step 1: read.", "Here it is."),
    (("qwen2.5", {}), "<think>\nplan\n</think>\n\nHi", "", "<think>\nplan\n</think>\n\nHi"),
    (("mistral_v13", {}), "[THINK]plan[/THINK]answer", "plan", "answer"),
    # DeepSeek-R1 omits <think>, R1-0528 emits it; both end at </think>.
    (
        ("deepseek_r1", {}),
        "I need to think about this...</think>The answer is 42.",
        "I need to think about this...",
        "The answer is 42.",
    ),
    (
        ("deepseek_r1", {}),
        "<think>I need to think about this...</think>The answer is 42.",
        "I need to think about this...",
        "The answer is 42.",
    ),
    (("deepseek_r1", {}), "<think>Let me count: 1, 2,", "Let me count: 1, 2,", ""),
    (("deepseek_r1", {}), "No tags at all.", "No tags at all.", ""),
    (("step3", {}), "Think first.</think>Then answer.", "Think first.", "Then answer."),
    # Qwen3 hybrid, thinking on: whitespace around the tags is kept as the model wrote it.
    (
        ("qwen3", {}),
        "<think>\nreasoning content\n</think>\n\nThe answer is 42.",
        "\nreasoning content\n",
        "\n\nThe answer is 42.",
    ),
    (("qwen3_thinking", {}), "The template opened it.</think>Answer.", "The template opened it.", "Answer."),
    (
        ("qwen3", {"force_reasoning": True}),
        "The template opened it.</think>Answer.",
        "The template opened it.",
        "Answer.",
    ),
    (("qwen3", {"enable_thinking": True}), "<think>a</think>b", "a", "b"),
    (("qwen3", {"enable_thinking": False}), "The answer is 42.", "", "The answer is 42."),
    (("qwen3", {"enable_thinking": False}), "x < y, so <thin ice", "", "x < y, so <thin ice"),
    (("qwen3", {}), "<think>I should call the tool." + TOOL_CALL, "I should call the tool.", TOOL_CALL),
    (("qwen3", {}), "<think>Plan.</think>" + TOOL_CALL, "Plan.", TOOL_CALL),
    (("qwen3_thinking", {}), "Let me think.</think>42", "Let me think.", "42"),
    (("qwen3_thinking", {"enable_thinking": False}), "Still thinking.</think>42", "Still thinking.", "42"),
    (("kimi", {}), "◁think▷用户问的是 2+2。◁/think▷答案是 4。", "用户问的是 2+2。", "答案是 4。"),
    (("kimi", {}), "<think>not kimi's tags</think>ok", "", "<think>not kimi's tags</think>ok"),
    (("kimi", {}), "no reasoning", "", "no reasoning"),
    (("glm45", {}), "<think>分析一下 🤔</think>你好！", "分析一下 🤔", "你好！"),
    (("glm45", {}), "<think>Use the tool." + TOOL_CALL, "Use the tool.", TOOL_CALL),
    (("glm45", {"enable_thinking": False}), "Hello.", "", "Hello."),
    (("basic", {}), "<think>a</think>b", "a", "b"),
    (("basic", {}), "No reasoning here.", "", "No reasoning here."),
    (("basic", {}), "Hi <think>a</think>b", "a", "Hi b"),
    (("basic", {}), "<think>a</think>b<think>c</think>d", "ac", "bd"),
    (("basic", {}), "a stray </think> closer", "", "a stray  closer"),
    (("basic", {}), "<think><think>echo</think>x", "echo", "x"),
    (("basic", {}), "<think>cut off mid-tag </thi", "cut off mid-tag </thi", ""),
    (("basic", {"force_reasoning": True}), "prompt opened it</think>x", "prompt opened it", "x"),
    (("passthrough", {}), "<think>a</think>b", "", "<think>a</think>b"),
    # gpt-oss, from the OpenAI harmony guide (the prompt ends with <|start|>assistant).
    (
        ("gpt_oss", {}),
        (
            '<|channel|>analysis<|message|>User asks: "What is 2 + 2?" Simple arithmetic. Provide '
            "answer.<|end|><|start|>assistant<|channel|>final<|message|>2 + 2 = 4.<|return|>"
        ),
        'User asks: "What is 2 + 2?" Simple arithmetic. Provide answer.',
        "2 + 2 = 4.",
    ),
    (
        ("gpt_oss", {}),
        "<|channel|>analysis<|message|>Need to use function get_weather.<|end|>" + GPT_OSS_CALL,
        "Need to use function get_weather.",
        GPT_OSS_CALL,
    ),
    (
        ("gpt_oss", {}),
        "<|channel|>analysis<|message|>{long chain of thought}<|end|><|start|>assistant"
        "<|channel|>commentary<|message|>**Action plan**:\n1. Generate an HTML file\n---\nWill "
        "start executing the plan step by step<|end|>" + GPT_OSS_PREAMBLE_CALL,
        "{long chain of thought}",
        "**Action plan**:\n1. Generate an HTML file\n---\nWill start executing the plan step by "
        "step" + GPT_OSS_PREAMBLE_CALL,
    ),
    (
        ("gpt_oss", {}),
        "<|start|>assistant to=functions.lookup<|channel|>commentary json<|message|>{}<|call|>",
        "",
        "<|start|>assistant to=functions.lookup<|channel|>commentary json<|message|>{}<|call|>",
    ),
    (("gpt_oss", {}), "<|channel|>analysis<|message|>cut by max_tok", "cut by max_tok", ""),
    (("gpt_oss", {}), "<|channel|>analysis<|message|>a<|end|><|start|>assistant<|chan", "a", ""),
    (("gpt_oss", {}), "<|channel|>final<|message|>no stop token", "", "no stop token"),
    (("gpt_oss", {}), "<|channel|>analysis<|message|>a<|channel|>final<|message|>b", "a", "b"),
    (("gpt_oss", {}), "plain text, no harmony", "", "plain text, no harmony"),
    # MiniMax-M2: the template opened <think>; `minimax_append_think` gives it back to the client.
    (("minimax", {}), "The user greets me.</think>Hello!", "The user greets me.", "Hello!"),
    (("minimax", {}), "Plan.<minimax:tool_call>\n<invoke", "Plan.", "<minimax:tool_call>\n<invoke"),
    (("minimax_append_think", {}), "The user greets me.</think>Hello!", "", "<think>The user greets me.</think>Hello!"),
    # smg's cohere_cmd.rs tests (CMD3/CMD4 framing is dropped here, not left to the tool parser).
    (("cohere_cmd", {}), "<|START_THINKING|><|END_THINKING|>The answer.", "", "The answer."),
    (
        ("cohere_cmd", {}),
        (
            "<|START_THINKING|>\nLet me analyze this step by step.\n<|END_THINKING|>\n"
            "<|START_RESPONSE|>The answer is 42.<|END_RESPONSE|>"
        ),
        "\nLet me analyze this step by step.\n",
        "\nThe answer is 42.",
    ),
    (("cohere_cmd", {}), "This is a normal response.", "", "This is a normal response."),
    # SGLang's CohereCommand4Detector docstring: the template opened thinking.
    (
        ("cohere_command4", {}),
        "thinking_content<|END_THINKING|><|START_TEXT|>final_answer<|END_TEXT|>",
        "thinking_content",
        "final_answer",
    ),
    (("cohere_command4", {}), "<|START_TEXT|>final_answer<|END_TEXT|>", "", "final_answer"),
    (
        ("cohere_command4", {}),
        'Plan.<|START_ACTION|>[{"tool_name": "f"}]<|END_ACTION|>',
        "Plan.",
        '<|START_ACTION|>[{"tool_name": "f"}]<|END_ACTION|>',
    ),
    # smg's nano_v3.rs: Nemotron's template puts <think> in the prompt when thinking is on.
    (("nano_v3", {"force_reasoning": True}), "reasoning content</think>answer", "reasoning content", "answer"),
    (("nano_v3", {}), "<think>a</think>b", "a", "b"),
    (("deepseek_v31", {}), "<think>a</think>b", "a", "b"),
    (("deepseek_v31", {}), "No thinking requested.", "", "No thinking requested."),
    (("deepseek_v4", {}), "<think>a</think>b", "a", "b"),
    # SGLang's InklingDetector comment, and a tool block passed through for the tool parser.
    (
        ("inkling", {}),
        (
            "<|message_model|><|content_thinking|>reasoning<|end_message|><|message_model|>"
            "<|content_text|>visible answer<|end_message|><|content_model_end_sampling|>"
        ),
        "reasoning",
        "visible answer",
    ),
    (
        ("inkling", {}),
        (
            "<|message_model|><|content_thinking|>plan<|end_message|><|message_model|>search"
            '<|content_invoke_tool_json|>{"name":"search","args":{}}<|end_message|>'
        ),
        "plan",
        '<|message_model|>search<|content_invoke_tool_json|>{"name":"search","args":{}}<|end_message|>',
    ),
    (("inkling", {}), "plain text", "", "plain text"),
    # Kimi K2.5 thinks in <think> and may open its tool section without closing it.
    (("kimi_k25", {}), "<think>a</think>b", "a", "b"),
    (
        ("kimi_k25", {}),
        "<think>I'll call it.<|tool_calls_section_begin|><|tool_call_begin|>",
        "I'll call it.",
        "<|tool_calls_section_begin|><|tool_call_begin|>",
    ),
    (("kimi_thinking", {}), "Still thinking.</think>Done.", "Still thinking.", "Done."),
    # smg's kimi_k3.rs reasoning tests.
    (("kimi_k3", {}), "<|open|>think<|sep|>step <|close|>think<|sep|><|open|>response<|sep|>answer", "step ", "answer"),
    (
        ("kimi_k3", {}),
        (
            "<|open|>think<|sep|>step<|close|>think<|sep|><|open|>response<|sep|>answer<|close|>response<|sep|><|open|>tools<|sep|>CALLS"
            "<|close|>tools<|sep|>"
        ),
        "step",
        "answer<|open|>tools<|sep|>CALLS<|close|>tools<|sep|>",
    ),
    (
        ("kimi_k3", {}),
        "<|open|>think<|sep|>r<|close|>think<|sep|><|open|>message<|sep|>answer<|close|>message<|sep|>",
        "r",
        "answer",
    ),
    (
        ("kimi_k3", {"force_reasoning": True}),
        (
            '<|open|>tools<|sep|><|open|>call tool="f" index="1"<|sep|>'
            "<|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|>"
        ),
        "",
        '<|open|>tools<|sep|><|open|>call tool="f" index="1"<|sep|><|close|>call<|sep|><|close|>tools<|sep|>',
    ),
    (("kimi_k3", {}), "just an answer", "", "just an answer"),
    # Mistral Small 4 with reasoning_effort="high".
    (("mistral", {}), "[THINK]The user asks for 2+2.[/THINK]4", "The user asks for 2+2.", "4"),
    (("hunyuan", {}), "<think>a</think>b", "a", "b"),
    (
        ("hunyuan", {}),
        "<think>Call it.<tool_calls>\n<tool_call>f<tool_sep>",
        "Call it.",
        "<tool_calls>\n<tool_call>f<tool_sep>",
    ),
    # vLLM's test_seed_oss_tool_parser.py (thinking budget reflections stay reasoning).
    (
        ("seed_oss", {}),
        (
            "<seed:think>The budget is 512.</seed:cot_budget_reflect>\nCall get_weather.</seed:think>\n"
            "<seed:tool_call>\n<function=get_weather>"
        ),
        "The budget is 512.</seed:cot_budget_reflect>\nCall get_weather.",
        "\n<seed:tool_call>\n<function=get_weather>",
    ),
]


@pytest.mark.parametrize(
    ("config", "text", "reasoning", "content"), GOLDEN, ids=[f"{_label(g[0])}:{g[1][:24]}" for g in GOLDEN]
)
def test_golden_whole_text(config: Config, text: str, reasoning: str, content: str) -> None:
    assert whole(config, text) == (reasoning, content)


@pytest.mark.parametrize(
    ("config", "text", "reasoning", "content"), GOLDEN, ids=[f"{_label(g[0])}:{g[1][:24]}" for g in GOLDEN]
)
def test_golden_every_split(config: Config, text: str, reasoning: str, content: str) -> None:
    """Every single cut, every pair of cuts (short texts) and one delta per character."""
    expected = (reasoning, content)
    for point in range(len(text) + 1):
        assert stream(config, cut(text, [point])) == expected, point
    if len(text) <= 90:
        for pair in itertools.combinations(range(1, len(text)), 2):
            assert stream(config, cut(text, pair)) == expected, pair
    assert stream(config, list(text)) == expected


# --- streaming properties -------------------------------------------------------------------

# Fragments that make tags, partial tags, look-alikes, whitespace and multi-byte characters.
FRAGMENTS = [
    "a",
    "b",
    " ",
    "\n",
    "<",
    ">",
    "/",
    "<t",
    "<thin",
    "think",
    "</",
    "</thi",
    "é",
    "思",
    "🤔",
    "◁",
    "▷",
    "◁th",
    "<|",
    "|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "◁think▷",
    "◁/think▷",
    *HARMONY,
    "analysis",
    "final",
    "commentary",
    " to=f",
    *sorted({t for tags in TAGS.values() for t in tags} - set(HARMONY)),
    "<|open|>",
    "<|sep|>",
    "[THINK",
    "<seed:",
    "<|START_",
    "thought\n",
    "thou",
    "]<]minimax[>[",
]
texts = st.lists(st.sampled_from(FRAGMENTS), max_size=25).map("".join)


@FUZZ
@given(config=st.sampled_from(CONFIGS), text=texts, cuts=st.lists(st.integers(0, 400), max_size=10))
def test_any_chunking_equals_whole_text(config: Config, text: str, cuts: list[int]) -> None:
    points = {c % (len(text) + 1) for c in cuts}
    assert stream(config, cut(text, points)) == whole(config, text)


def _reference_tags(text: str, tags: Sequence[str], in_reasoning: bool) -> tuple[str, str]:
    """Independent one-character-at-a-time reading of the think-tag formats."""
    start, end, *tool = tags
    reasoning: list[str] = []
    content: list[str] = []
    i = 0
    while i < len(text):
        active = (end, start, *tool) if in_reasoning else (start, end)
        tag = next((t for t in active if text.startswith(t, i)), None)
        if tag is None:
            (reasoning if in_reasoning else content).append(text[i])
            i += 1
            continue
        i += len(tag)
        in_reasoning = tag == start
        if tag in tool:
            content.append(tag)
    return "".join(reasoning), "".join(content)


@FUZZ
@given(text=texts)
def test_tag_formats_match_an_independent_reading(text: str) -> None:
    for name in SIMPLE_TAG_FORMATS:
        tags = TAGS[name]
        forced = REASONING_FORMATS[name].starts_in_reasoning
        assert whole((name, {}), text) == _reference_tags(text, tags, forced), name
    assert whole(("qwen3", {"enable_thinking": False}), text) == _reference_tags(text, TAGS["qwen3"], False)


@FUZZ
@given(config=st.sampled_from([c for c in CONFIGS if c[0] != "gpt_oss"]), text=texts)
def test_only_a_possible_partial_tag_is_held_back(config: Config, text: str) -> None:
    """Fed one character at a time, the output so far is the whole-text answer for the text
    so far whenever that text cannot end in the start of a tag."""
    tags = TAGS[config[0]]
    parser = reasoning_parser(config[0], **config[1])
    reasoning, content = "", ""
    for i, char in enumerate(text, 1):
        delta = parser.feed(char)
        reasoning += delta.reasoning
        content += delta.content
        prefix = text[:i]
        if not any(t.startswith(prefix[-k:]) for t in tags for k in range(1, len(t))):
            assert (reasoning, content) == whole(config, prefix)


def test_harmony_holds_a_header_until_its_body_starts() -> None:
    parser = reasoning_parser("gpt_oss")
    assert parser.feed("<|channel|>analy") == ReasoningDelta()
    assert parser.feed("sis<|message|>We") == ReasoningDelta(reasoning="We")
    assert parser.feed(" think<|e") == ReasoningDelta(reasoning=" think")
    assert parser.feed("nd|><|start|>assistant<|channel|>final<|message|>Hi") == ReasoningDelta(content="Hi")
    assert parser.finish() == ReasoningDelta()


# --- behaviour at the edges -----------------------------------------------------------------


def test_a_partial_tag_is_held_then_released_as_text() -> None:
    parser = reasoning_parser("basic")
    assert parser.feed("Use <thin") == ReasoningDelta(content="Use ")
    assert parser.feed("g>s") == ReasoningDelta(content="<thing>s")
    assert parser.feed(" like </th") == ReasoningDelta(content=" like ")
    assert parser.finish() == ReasoningDelta(content="</th")


def test_a_tag_split_across_deltas_switches_mode_without_leaking() -> None:
    parser = reasoning_parser("deepseek_r1")
    deltas = [parser.feed(c) for c in ["Hmm, 2+2", "=4.</", "thi", "nk>", "\n\nIt is 4."]]
    deltas.append(parser.finish())
    assert deltas == [
        ReasoningDelta(reasoning="Hmm, 2+2"),
        ReasoningDelta(reasoning="=4."),
        ReasoningDelta(),
        ReasoningDelta(),
        ReasoningDelta(content="\n\nIt is 4."),
        ReasoningDelta(),
    ]


def test_unterminated_reasoning_is_flushed_as_reasoning() -> None:
    parser = reasoning_parser("qwen3")
    assert parser.feed("<think>still going <") == ReasoningDelta(reasoning="still going ")
    assert parser.finish() == ReasoningDelta(reasoning="<")


def test_enable_thinking_false_means_no_reasoning_section_for_qwen3() -> None:
    assert whole(("qwen3", {"enable_thinking": False}), "42</think>") == ("", "42")
    assert whole(("qwen3", {}), "42") == ("", "42"), "without <think> the output is content"
    assert whole(("qwen3", {}), "<think>hm</think>42") == ("hm", "42")


def test_every_parser_is_fresh_per_request() -> None:
    first = reasoning_parser("qwen3")
    first.feed("<think>half a thou")
    second = reasoning_parser("qwen3", enable_thinking=False)
    assert second is not first
    assert second.feed("Answer.") == ReasoningDelta(content="Answer.")


def test_finish_is_once_per_stream() -> None:
    parser = reasoning_parser("basic")
    assert parser.feed("<think>x</thi") == ReasoningDelta(reasoning="x")
    assert parser.finish() == ReasoningDelta(reasoning="</thi")
    assert parser.finish() == ReasoningDelta()
    with pytest.raises(RuntimeError):
        parser.feed("more")


def test_empty_deltas_are_harmless() -> None:
    parser = reasoning_parser("kimi")
    assert not parser.feed("")
    assert parser.feed("◁think▷x") == ReasoningDelta(reasoning="x")
    assert not parser.feed("")


# --- names ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("alias", "canonical"),
    [
        ("deepseek-r1", "deepseek_r1"),
        ("DeepSeek-R1", "deepseek_r1"),
        ("qwen3-thinking", "qwen3_thinking"),
        ("gpt-oss", "gpt_oss"),
        ("base", "basic"),
        ("step3p5", "step3"),
        (" glm45 ", "glm45"),
    ],
)
def test_peer_spellings_are_aliases(alias: str, canonical: str) -> None:
    for text in ("<think>a</think>b", "a</think>b", "◁think▷a◁/think▷b", "<|channel|>analysis<|message|>a<|end|>"):
        assert whole((alias, {}), text) == whole((canonical, {}), text)


def test_known_names_resolve_to_canonical_formats() -> None:
    assert set(KNOWN_REASONING_PARSERS.values()) == set(TAGS)
    for name, canonical in KNOWN_REASONING_PARSERS.items():
        assert KNOWN_REASONING_PARSERS[canonical] == canonical
        assert isinstance(reasoning_parser(name), ReasoningParser)


def test_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(UnknownReasoningParser, match="deepseek_r1"):
        reasoning_parser("llama4")


@pytest.mark.parametrize(
    ("name", "prompt"),
    [
        ("qwen3", "<|im_start|>assistant\n<think>\n"),
        ("kimi_k3", "<|open|>assistant<|sep|><|open|>think<|sep|>"),
        ("cohere_cmd", "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|><|START_THINKING|>"),
        ("seed_oss", "<seed:bos>assistant\n<seed:think>"),
        ("inkling", "<|message_model|><|content_thinking|>"),
    ],
)
def test_a_prompt_that_opens_the_block_starts_the_output_in_reasoning(name: str, prompt: str) -> None:
    parser = reasoning_parser(name, prompt=prompt)
    delta = parser.feed("thought")
    assert delta == ReasoningDelta(reasoning="thought")
    other = reasoning_parser(name, prompt="a prompt that leaves the block closed")
    assert other.feed("thought") == ReasoningDelta(content="thought")


def test_overlapping_markers_are_refused() -> None:
    with pytest.raises(ValueError, match="overlap"):
        ThinkTagParser("<think>", "</think>", tool_start="think")
