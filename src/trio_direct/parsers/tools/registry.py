"""Tool-call parser names: ours, and how SGLang, smg, vLLM and Dynamo spell the same formats."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, Final

from trio_direct.parsers.tools.argument_tag_calls import (
    Glm45Parser,
    HunyuanParser,
    IQuestParser,
    Qwen3CoderParser,
    SeedOssParser,
)
from trio_direct.parsers.tools.gemma_calls import FunctionGemmaParser, Gemma4Parser
from trio_direct.parsers.tools.harmony_calls import GptOssParser
from trio_direct.parsers.tools.invoke_calls import (
    DeepSeekV4Parser,
    DeepSeekV32Parser,
    DeepSeekV41Parser,
    MinimaxM2Parser,
    Step3Parser,
)
from trio_direct.parsers.tools.json_calls import (
    CohereParser,
    GraniteParser,
    HermesParser,
    InklingParser,
    JsonParser,
    Llama3JsonParser,
    LlamaNemotronParser,
    MistralParser,
)
from trio_direct.parsers.tools.kimi_channel_calls import KimiK3Parser
from trio_direct.parsers.tools.pythonic import Lfm25Parser, Olmo3Parser, PythonicParser, SarashinaParser
from trio_direct.parsers.tools.special_token_calls import (
    DeepSeekV3Parser,
    DeepSeekV31Parser,
    KimiK2Parser,
)
from trio_direct.parsers.tools.stream import ToolCallParser
from trio_direct.parsers.tools.tree_calls import MinimaxM3Parser

__all__ = [
    "KNOWN_TOOL_CALL_PARSERS",
    "TOOL_CALL_FORMATS",
    "UnknownToolCallParser",
    "normalize_parser_name",
    "tool_call_parser",
]

TOOL_CALL_FORMATS: Final[Mapping[str, type[ToolCallParser]]] = MappingProxyType(
    {
        parser.format: parser
        for parser in (
            ToolCallParser,
            JsonParser,
            HermesParser,
            Qwen3CoderParser,
            SeedOssParser,
            Llama3JsonParser,
            MistralParser,
            PythonicParser,
            DeepSeekV3Parser,
            DeepSeekV31Parser,
            DeepSeekV32Parser,
            DeepSeekV4Parser,
            KimiK2Parser,
            KimiK3Parser,
            Glm45Parser,
            Step3Parser,
            SarashinaParser,
            InklingParser,
            MinimaxM2Parser,
            CohereParser,
            GptOssParser,
            HunyuanParser,
            GraniteParser,
            IQuestParser,
            DeepSeekV41Parser,
            Lfm25Parser,
            Olmo3Parser,
            LlamaNemotronParser,
            Gemma4Parser,
            FunctionGemmaParser,
            MinimaxM3Parser,
        )
    }
)

# Every accepted name (after `normalize_parser_name`) to its format.
KNOWN_TOOL_CALL_PARSERS: Final = MappingProxyType(
    {
        "passthrough": "passthrough",  # smg: no tool calls, all text is content
        "json": "json",  # smg: bare JSON call objects
        "hermes": "hermes",  # SGLang, Dynamo, vLLM: Qwen2.5 / Qwen3 / Hermes
        "qwen": "hermes",  # SGLang, smg
        "qwen25": "hermes",  # SGLang
        "qwen3_coder": "qwen3_coder",  # SGLang, Dynamo, vLLM
        "qwen_xml": "qwen3_coder",  # smg
        "qwen_coder": "qwen3_coder",  # smg
        "qwen3_xml": "qwen3_coder",  # vLLM
        "nemotron": "qwen3_coder",  # smg (Nemotron-3 writes the same XML)
        "step3p5": "qwen3_coder",  # SGLang
        "seed_oss": "seed_oss",  # vLLM
        "llama3_json": "llama3_json",  # Dynamo, vLLM
        "llama3": "llama3_json",  # SGLang
        "llama": "llama3_json",  # smg
        "mistral": "mistral",  # everyone; v11+ tokenizers' `[TOOL_CALLS]name[ARGS]{...}` included
        "pythonic": "pythonic",  # everyone: Llama 3.2 / 4
        "llama4_pythonic": "pythonic",  # vLLM
        "deepseek_v3": "deepseek_v3",  # Dynamo
        "deepseekv3": "deepseek_v3",  # SGLang
        "deepseek": "deepseek_v3",  # smg
        "deepseek_v31": "deepseek_v31",  # vLLM
        "deepseekv31": "deepseek_v31",  # SGLang
        "deepseek31": "deepseek_v31",  # smg
        "deepseek_v3_1": "deepseek_v31",  # Dynamo
        "deepseek_v32": "deepseek_v32",
        "deepseekv32": "deepseek_v32",  # SGLang
        "deepseek32": "deepseek_v32",  # smg
        "deepseek_v3_2": "deepseek_v32",  # Dynamo
        "deepseek_v4": "deepseek_v4",  # smg, Dynamo
        "deepseekv4": "deepseek_v4",  # SGLang
        "kimi_k2": "kimi_k2",  # SGLang, Dynamo, vLLM
        "kimik2": "kimi_k2",  # smg
        "kimi_k3": "kimi_k3",  # SGLang, smg
        "glm45": "glm45",  # SGLang, vLLM
        "glm": "glm45",  # SGLang
        "glm45_moe": "glm45",  # smg
        "glm4_moe": "glm45",
        "glm47": "glm45",  # SGLang, Dynamo: GLM-4.7 drops the newlines, which glm45 accepts
        "glm47_moe": "glm45",  # smg
        "step3": "step3",  # SGLang, smg, vLLM
        "sarashina": "sarashina",  # smg
        "inkling": "inkling",  # SGLang, smg
        "minimax_m2": "minimax_m2",  # smg, Dynamo, vLLM; SGLang spells it minimax-m2
        "cohere": "cohere",  # smg
        "cohere_command4": "cohere",  # SGLang
        "gpt_oss": "gpt_oss",  # SGLang spells it gpt-oss
        "harmony": "gpt_oss",  # Dynamo
        "openai": "gpt_oss",  # vLLM
        "hunyuan": "hunyuan",  # SGLang
        "granite": "granite",  # vLLM
        # smg 1.13's Symphony table names (a table reads both; here its call syntax), and its
        # newer legacy parsers.
        "qwen3": "hermes",  # smg table: Qwen3's JSON calls in `<tool_call>`
        "qwen2.5": "hermes",  # smg table
        "qwen3_tagged": "qwen3_coder",  # smg table: Qwen 3.5+ / Qwen3-Coder's tags
        "qwen3_tagged_direct": "qwen3_coder",  # smg table
        "glm4": "glm45",  # smg table
        "ling": "glm45",  # smg table: GLM 4.5's keyed tags with newlines
        "xlam": "json",  # smg table: the whole output a JSON list of calls, or content
        "mistral_v13": "mistral",  # smg table: `[TOOL_CALLS]NAME[ARGS]{…}`
        "plain": "passthrough",  # smg table: no calls
        "hy4": "hunyuan",  # smg table (Hy4 writes no `<tool_sep>`)
        "hy_v4": "hunyuan",  # smg
        "iquest": "iquest",  # smg table
        "deepseek_v41": "deepseek_v41",  # smg
        "deepseek_v4.1": "deepseek_v41",  # smg table
        "lfm2.5": "lfm2_5",  # smg table
        "lfm2_5": "lfm2_5",
        "olmo3": "olmo3",  # smg table
        "llama_nemotron": "llama_nemotron",  # smg table
        "gemma4": "gemma4",  # smg, SGLang, vLLM
        "function_gemma": "function_gemma",  # smg table
        "functiongemma": "function_gemma",  # vLLM
        "minimax_m3": "minimax_m3",  # smg, vLLM
    }
)


class UnknownToolCallParser(ValueError):
    """No tool-call format has this name; the message lists the known ones."""


def normalize_parser_name(name: str) -> str:
    """Names are case-insensitive, `-` equals `_`, and surrounding spaces do not count."""
    return name.strip().lower().replace("-", "_")


def tool_call_parser(
    name: str, tools: Sequence[Mapping[str, Any]] | None = None, *, rng: random.Random | None = None
) -> ToolCallParser:
    """A fresh parser for one choice of one request (parsers hold per-stream state).

    `tools` is the request's OpenAI `tools`; `rng` makes call ids reproducible (tests).
    """
    kind = KNOWN_TOOL_CALL_PARSERS.get(normalize_parser_name(name))
    if kind is None:
        known = ", ".join(sorted(KNOWN_TOOL_CALL_PARSERS))
        raise UnknownToolCallParser(f"unknown tool-call parser {name!r}; known: {known}")
    return TOOL_CALL_FORMATS[kind](tools, rng=rng)
