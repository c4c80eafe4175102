"""Tool-call parser names: ours, and how SGLang, smg and Dynamo spell the same formats."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, Final

from trio_direct.parsers.tools.json_calls import HermesParser, Llama3JsonParser, MistralParser
from trio_direct.parsers.tools.pythonic import PythonicParser
from trio_direct.parsers.tools.special_token_calls import (
    DeepSeekV3Parser,
    DeepSeekV31Parser,
    KimiK2Parser,
)
from trio_direct.parsers.tools.stream import ToolCallParser
from trio_direct.parsers.tools.xml_calls import Glm45Parser, Qwen3CoderParser

__all__ = ["KNOWN_TOOL_CALL_PARSERS", "UnknownToolCallParser", "tool_call_parser"]

_FORMATS: Final[Mapping[str, type[ToolCallParser]]] = MappingProxyType({
    parser.format: parser
    for parser in (ToolCallParser, HermesParser, Qwen3CoderParser, Llama3JsonParser,
                   MistralParser, PythonicParser, DeepSeekV3Parser, DeepSeekV31Parser,
                   KimiK2Parser, Glm45Parser)
})

# Every accepted name (after lower-casing and `-` -> `_`) to its format.
KNOWN_TOOL_CALL_PARSERS: Final = MappingProxyType({
    "hermes": "hermes",  # SGLang, Dynamo: Qwen2.5 / Qwen3 / Hermes
    "qwen": "hermes",  # SGLang, smg
    "qwen25": "hermes",  # SGLang
    "qwen3_coder": "qwen3_coder",  # SGLang, Dynamo
    "qwen_xml": "qwen3_coder",  # smg
    "qwen_coder": "qwen3_coder",  # smg
    "nemotron": "qwen3_coder",  # smg (Nemotron-3 writes the same XML)
    "step3p5": "qwen3_coder",  # SGLang
    "llama3_json": "llama3_json",  # Dynamo
    "llama3": "llama3_json",  # SGLang
    "llama": "llama3_json",  # smg
    "mistral": "mistral",
    "pythonic": "pythonic",
    "deepseek_v3": "deepseek_v3",  # Dynamo
    "deepseekv3": "deepseek_v3",  # SGLang
    "deepseek": "deepseek_v3",  # smg
    "deepseek_v31": "deepseek_v31",
    "deepseekv31": "deepseek_v31",  # SGLang
    "deepseek31": "deepseek_v31",  # smg
    "deepseek_v3_1": "deepseek_v31",  # Dynamo
    "kimi_k2": "kimi_k2",  # SGLang, Dynamo
    "kimik2": "kimi_k2",  # smg
    "glm45": "glm45",  # SGLang
    "glm": "glm45",  # SGLang
    "glm45_moe": "glm45",  # smg
    "glm4_moe": "glm45",
    "glm47": "glm45",  # SGLang, Dynamo: GLM-4.7 drops the newlines, which glm45 accepts
    "glm47_moe": "glm45",  # smg
    "passthrough": "passthrough",  # smg: no tool calls, all text is content
})


class UnknownToolCallParser(ValueError):
    """No tool-call format has this name; the message lists the known ones."""


def tool_call_parser(name: str, tools: Sequence[Mapping[str, Any]] | None = None, *,
                     rng: random.Random | None = None) -> ToolCallParser:
    """A fresh parser for one choice of one request (parsers hold per-stream state).

    `tools` is the request's OpenAI `tools`; `rng` makes call ids reproducible (tests).
    """
    key = name.strip().lower().replace("-", "_")
    kind = KNOWN_TOOL_CALL_PARSERS.get(key)
    if kind is None:
        known = ", ".join(sorted(KNOWN_TOOL_CALL_PARSERS))
        raise UnknownToolCallParser(f"unknown tool-call parser {name!r}; known: {known}")
    return _FORMATS[kind](tools, rng=rng)
