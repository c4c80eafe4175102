"""Choosing the parsers at start-up: flag, then engine report, then the model's name (smg's tables)."""

from __future__ import annotations

import pytest

from trio_direct.parsers.reasoning import KNOWN_REASONING_PARSERS, UnknownReasoningParser
from trio_direct.parsers.selection import (
    REASONING_MODEL_PATTERNS,
    TOOL_CALL_MODEL_PATTERNS,
    reasoning_parser_for_model,
    select_parsers,
    tool_call_parser_for_model,
)
from trio_direct.parsers.tools import KNOWN_TOOL_CALL_PARSERS, UnknownToolCallParser


def choose(**given):
    arguments = {
        "tool_call_flag": None,
        "reasoning_flag": None,
        "engine_tool_call_parser": None,
        "engine_reasoning_parser": None,
        "model_path": None,
        "served_model_name": None,
    }
    arguments.update(given)
    return select_parsers(**arguments)


def test_the_flag_wins_over_the_engines_and_the_model() -> None:
    chosen = choose(
        tool_call_flag="Qwen-XML",
        reasoning_flag="deepseek-r1",
        engine_tool_call_parser="hermes",
        engine_reasoning_parser="qwen3",
        model_path="openai/gpt-oss-20b",
    )
    assert (chosen.tool_call_parser, chosen.reasoning_parser) == ("qwen3_coder", "deepseek_r1")
    assert chosen.tool_call_source == "--tool-call-parser Qwen-XML" and chosen.warnings == ()


def test_an_unknown_flag_stops_start_up_listing_every_known_name() -> None:
    with pytest.raises(UnknownToolCallParser) as tool_error:
        choose(tool_call_flag="harmonica")
    message = str(tool_error.value)
    assert "'harmonica'" in message and all(name in message for name in KNOWN_TOOL_CALL_PARSERS)
    with pytest.raises(UnknownReasoningParser) as reasoning_error:
        choose(reasoning_flag="thinky", model_path="Qwen/Qwen3-8B")
    assert all(name in str(reasoning_error.value) for name in KNOWN_REASONING_PARSERS)
    assert issubclass(UnknownToolCallParser, ValueError) and issubclass(UnknownReasoningParser, ValueError)


@pytest.mark.parametrize(
    ("engine_tool", "engine_reasoning", "tool", "reasoning"),
    [
        # What SGLang's --tool-call-parser / --reasoning-parser values look like in GetServerInfo.
        ("qwen25", "qwen3", "hermes", "qwen3"),
        ("deepseekv32", "deepseek-v3", "deepseek_v32", "deepseek_v31"),
        ("gpt-oss", "gpt-oss", "gpt_oss", "gpt_oss"),
        ("minimax-m2", "minimax-append-think", "minimax_m2", "minimax_append_think"),
        ("kimi_k2", "kimi_k2", "kimi_k2", "kimi_k25"),
        ("glm47", "glm45", "glm45", "glm45"),
        ("step3p5", "step3p5", "qwen3_coder", "step3"),
        ("cohere_command4", "cohere_command4", "cohere", "cohere_command4"),
    ],
)
def test_engine_reported_names_map_onto_ours(engine_tool, engine_reasoning, tool, reasoning) -> None:
    chosen = choose(
        engine_tool_call_parser=engine_tool, engine_reasoning_parser=engine_reasoning, model_path="some/other-model"
    )
    assert (chosen.tool_call_parser, chosen.reasoning_parser) == (tool, reasoning)
    assert chosen.warnings == ()


def test_an_unknown_engine_name_is_a_warning_and_no_parser() -> None:
    chosen = choose(engine_tool_call_parser="lfm2", engine_reasoning_parser="ernie45", model_path="Qwen/Qwen3-8B")
    assert (chosen.tool_call_parser, chosen.reasoning_parser) == (None, None)  # not the model's patterns
    assert len(chosen.warnings) == 2 and "'lfm2'" in chosen.warnings[0] and "'ernie45'" in chosen.warnings[1]


def test_without_flag_or_engine_report_the_model_decides() -> None:
    chosen = choose(model_path="/models/deepseek-ai/DeepSeek-V3.2", served_model_name="ds")
    assert chosen.tool_call_parser == "deepseek_v32"
    assert "deepseek-ai/DeepSeek-V3.2*" in chosen.tool_call_source
    served = choose(model_path="/models/snapshot-1234", served_model_name="Qwen3-Coder-480B")
    assert (served.tool_call_parser, served.reasoning_parser) == ("qwen3_coder", "qwen3")
    nothing = choose(model_path="/models/unknown")
    assert (nothing.tool_call_parser, nothing.reasoning_parser, nothing.warnings) == (None, None, ())


def test_gpt_oss_gets_harmony_for_both() -> None:
    chosen = choose(model_path="openai/gpt-oss-120b")
    assert (chosen.tool_call_parser, chosen.reasoning_parser) == ("gpt_oss", "gpt_oss")
    lonely = choose(tool_call_flag="harmony", model_path="x")
    assert lonely.reasoning_parser is None and "analysis" in lonely.warnings[0]


# smg's own expectations (crates/tool_parser/src/tests.rs, tests/tool_parser_*.rs) under our names.
@pytest.mark.parametrize(
    ("model", "expected"),
    [
        *(
            (m, "qwen3_coder")
            for m in [
                "Qwen3.5-32B",
                "Qwen/Qwen3.5-4B",
                "qwen3.5-72b",
                "qwen/qwen3.5-32b",
                "Qwen3-Coder-480B",
                "Qwen/Qwen3-Coder-480B-A35B-Instruct",
                "qwen3-coder-7b",
                "qwen/qwen3-coder-32b",
            ]
        ),
        *(
            (m, "hermes")
            for m in [
                "Qwen2.5-72B-Instruct",
                "Qwen2.5-Coder-32B-Instruct",
                "qwen2.5-coder-7b",
                "Qwen3-32B",
                "Qwen/Qwen3-235B-A22B",
                "qwen3-8b",
            ]
        ),
        ("deepseek-v3.2", "deepseek_v32"),
        ("deepseek-ai/DeepSeek-V3.2", "deepseek_v32"),
        ("deepseek-v3.2-exp", "deepseek_v31"),
        ("deepseek-ai/DeepSeek-V3.2-Exp", "deepseek_v31"),
        ("deepseek-v4", "deepseek_v4"),
        ("deepseek-ai/DeepSeek-V4-Flash", "deepseek_v4"),
        ("deepseek-v3", "deepseek_v3"),
        ("deepseek-ai/DeepSeek-V3-0324", "deepseek_v3"),
        ("deepseek-v3.1", "deepseek_v31"),
        ("deepseek-coder", "pythonic"),
        *((m, "glm45") for m in ["glm-4.5-air", "glm-4.6", "glm-4.7", "glm-5", "glm-5.2-fp8"]),
        ("glm-4-9b", "json"),
        ("Inkling-7B", "inkling"),
        ("org/Inkling-Chat", "inkling"),
        ("gpt-4-turbo", "json"),
        ("claude-3-opus", "json"),
        ("mistral-large", "mistral"),
        ("mixtral-8x7b", "mistral"),
        ("llama-4-scout", "pythonic"),
        ("llama-3.2-3b", "llama3_json"),
        ("llama-3.1-8b", "json"),
        ("kimi-k2-instruct", "kimi_k2"),
        ("moonshotai/Kimi-K2-Instruct", "kimi_k2"),
        ("moonshotai/Kimi-K3", "kimi_k3"),
        ("Kimi_K3", "kimi_k3"),
        ("MiniMaxAI/MiniMax-M2", "minimax_m2"),
        ("step3-vl", "step3"),
        ("stepfun-ai/Step-3", "step3"),
        ("sbintuitions/sarashina2.2-3b", "sarashina"),
        ("CohereForAI/c4ai-command-r-plus", "cohere"),
        ("command-a-03-2025", "cohere"),
        ("gemma-3-27b", "json"),
        ("openai/gpt-oss-20b", "gpt_oss"),
        # smg 1.13's additions; an M3 id gets M3's parser, not M2's, and Gemma 4 its own, not JSON.
        ("Qwen/Qwen3.6-27B", "qwen3_coder"),
        ("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", "qwen3_coder"),
        ("deepseek-ai/DeepSeek-V4.1-Flash", "deepseek_v41"),
        ("MiniMaxAI/MiniMax-M3", "minimax_m3"),
        ("mm-m3-chat", "minimax_m3"),
        ("google/gemma-4-E4B-it", "gemma4"),
        ("/models/gemma4-31b", "gemma4"),
        ("unknown-model", None),
    ],
)
def test_tool_call_patterns_resolve_as_smgs_factory_does(model: str, expected: str | None) -> None:
    found = tool_call_parser_for_model(model)
    assert (found[0] if found else None) == expected


# smg's reasoning factory tests (crates/reasoning_parser/src/factory.rs) under our names.
@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("deepseek-r1-distill", "deepseek_r1"),
        ("DeepSeek-R1", "deepseek_r1"),
        ("qwen3-7b", "qwen3"),
        ("QWEN3", "qwen3"),
        ("kimi-chat", "kimi"),
        ("Kimi", "kimi"),
        ("moonshotai/Kimi-K3", "kimi_k3"),
        ("Kimi_K3", "kimi_k3"),
        ("inkling-chat", "inkling"),
        ("step3-model", "step3"),
        ("glm45-v2", "glm45"),
        ("glm-5.2-fp8", "glm45"),
        ("minimax-m2", "minimax"),
        ("mm-m2-chat", "minimax"),
        ("nano-v3-chat", "nano_v3"),
        ("nemotron-nano-4b", "nano_v3"),
        ("NVIDIA-Nemotron/nemotron-super", "nano_v3"),
        ("command-r-plus", "cohere_cmd"),
        ("command-a-03-2025", "cohere_cmd"),
        ("c4ai-command-r-v01", "cohere_cmd"),
        ("cohere-embed", "cohere_cmd"),
        ("Qwen/Qwen3-235B-A22B-Thinking-2507", "qwen3"),
        ("qwen3-thinking-30b", "qwen3_thinking"),
        ("moonshotai/Kimi-K2-Thinking", "kimi_thinking"),
        ("moonshotai/Kimi-K2.5", "kimi_k25"),
        ("deepseek-v3.1-terminus", "deepseek_v31"),
        ("openai/gpt-oss-120b", "gpt_oss"),
        ("MiniMaxAI/MiniMax-M3", "minimax_m3"),
        ("deepseek-ai/DeepSeek-V4.1-Flash", "deepseek_v41"),
        ("google/gemma-4-E4B-it", "gemma4"),
        ("/models/gemma4-31b", "gemma4"),
        ("google/gemma-3-27b-it", None),  # no thinking channel before Gemma 4
        ("unknown-model", None),
    ],
)
def test_reasoning_patterns_resolve_as_smgs_factory_does(model: str, expected: str | None) -> None:
    found = reasoning_parser_for_model(model)
    assert (found[0] if found else None) == expected


def test_the_pattern_tables_name_only_parsers_we_have() -> None:
    assert set(TOOL_CALL_MODEL_PATTERNS.values()) <= set(KNOWN_TOOL_CALL_PARSERS)
    assert {name for _, name in REASONING_MODEL_PATTERNS} <= set(KNOWN_REASONING_PARSERS)
    # smg's tables, copied whole: 64 tool patterns (+ gpt-oss, + 16 of 1.13), 27 reasoning
    # patterns (+ gpt-oss, + 4 of 1.13).
    assert (len(TOOL_CALL_MODEL_PATTERNS), len(REASONING_MODEL_PATTERNS)) == (81, 32)
