"""Which tool-call and reasoning parser a served model gets (sans-IO, decided once at start-up).

Precedence, for each of the two: the operator's flag; else the parser the engines report (SGLang's
own `--tool-call-parser` / `--reasoning-parser`, read by the probe), mapped onto our names; else the
model path or served name, matched against the patterns of smg's parser factories. A flag naming
no known parser stops start-up with every known name listed; an engine-reported name we do not
know is a warning and no parser (the engine still serves; its output is plain content).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final, Protocol

from trio_direct.parsers.reasoning import KNOWN_REASONING_PARSERS, UnknownReasoningParser
from trio_direct.parsers.tools.registry import (
    KNOWN_TOOL_CALL_PARSERS,
    UnknownToolCallParser,
    normalize_parser_name,
)

__all__ = [
    "REASONING_MODEL_PATTERNS",
    "TOOL_CALL_MODEL_PATTERNS",
    "ParserSelection",
    "reasoning_parser_for_model",
    "select_parsers",
    "skip_special_tokens",
    "tool_call_parser_for_model",
]

# smg's tool-parser factory (`crates/tool_parser/src/factory.rs`, `register_default_mappings`),
# verbatim, plus the patterns smg 1.13 added (marked): pattern -> smg parser name. A pattern matches
# a model id that equals it, or (with its trailing `*` removed) occurs in it, case-insensitively;
# the longest matching stem wins (smg's `resolve_model_to_parser`). A pattern whose parser
# trio-direct does not have gives no parser, rather than a shorter pattern's wrong one.
TOOL_CALL_MODEL_PATTERNS: Final = MappingProxyType(
    {
        "gpt-4*": "json",
        "gpt-3.5*": "json",
        "gpt-4o*": "json",
        "claude-*": "json",
        "mistral-*": "mistral",
        "mixtral-*": "mistral",
        "Qwen/Qwen3.6*": "qwen_xml",  # 1.13
        "qwen/qwen3.6*": "qwen_xml",  # 1.13
        "Qwen/Qwen3.8*": "qwen_xml",  # 1.13
        "qwen/qwen3.8*": "qwen_xml",  # 1.13
        "nemotron-3*": "nemotron",  # 1.13
        "Qwen/Qwen3.5*": "qwen_xml",
        "Qwen3.5*": "qwen_xml",
        "qwen3.5*": "qwen_xml",
        "qwen/qwen3.5*": "qwen_xml",
        "Qwen/Qwen3-Coder*": "qwen_xml",
        "Qwen3-Coder*": "qwen_xml",
        "qwen3-coder*": "qwen_xml",
        "qwen/qwen3-coder*": "qwen_xml",
        "qwen*": "qwen",
        "Qwen*": "qwen",
        "llama-4*": "pythonic",
        "meta-llama-4*": "pythonic",
        "llama-3.2*": "llama",
        "meta-llama-3.2*": "llama",
        "llama-*": "json",
        "meta-llama-*": "json",
        "deepseek-v3*": "deepseek",
        "deepseek-ai/DeepSeek-V3*": "deepseek",
        "deepseek-v3.1*": "deepseek31",
        "deepseek-ai/DeepSeek-V3.1*": "deepseek31",
        "deepseek-v3.2-exp*": "deepseek31",
        "deepseek-ai/DeepSeek-V3.2-Exp*": "deepseek31",
        "deepseek-v3.2*": "deepseek32",
        "deepseek-ai/DeepSeek-V3.2*": "deepseek32",
        "deepseek-v4*": "deepseek_v4",
        "deepseek-ai/DeepSeek-V4*": "deepseek_v4",
        "deepseek-v4.1*": "deepseek_v41",  # 1.13
        "deepseek_v41*": "deepseek_v41",  # 1.13
        "deepseek-v41*": "deepseek_v41",  # 1.13
        "deepseek-ai/DeepSeek-V4.1*": "deepseek_v41",  # 1.13
        "deepseek-ai/DeepSeek-V41*": "deepseek_v41",  # 1.13
        "deepseek-*": "pythonic",
        "glm-4.5*": "glm45_moe",
        "glm-4.6*": "glm45_moe",
        "glm-4.7*": "glm47_moe",
        "glm-5*": "glm47_moe",
        "glm-*": "json",
        "sarashina*": "sarashina",
        "Sarashina*": "sarashina",
        "step3*": "step3",
        "Step-3*": "step3",
        "kimi-k2*": "kimik2",
        "Kimi-K2*": "kimik2",
        "moonshot*/Kimi-K2*": "kimik2",
        "kimi-k3*": "kimi_k3",
        "Kimi-K3*": "kimi_k3",
        "moonshot*/Kimi-K3*": "kimi_k3",
        "kimi_k3*": "kimi_k3",
        "Kimi_K3*": "kimi_k3",
        "moonshot*/Kimi_K3*": "kimi_k3",
        "inkling*": "inkling",
        "Inkling*": "inkling",
        "minimax-m3*": "minimax_m3",  # 1.13
        "MiniMax-M3*": "minimax_m3",  # 1.13
        "MiniMaxAI/MiniMax-M3*": "minimax_m3",  # 1.13
        "mm-m3*": "minimax_m3",  # 1.13
        "minimax*": "minimax_m2",
        "MiniMax*": "minimax_m2",
        "command-r*": "cohere",
        "command-r-plus*": "cohere",
        "command-a*": "cohere",
        "c4ai-command*": "cohere",
        "cohere*": "cohere",
        "CohereForAI*": "cohere",
        "gemini-*": "json",
        "palm-*": "json",
        "gemma-4*": "gemma4",  # 1.13
        "gemma4*": "gemma4",  # 1.13
        "gemma-*": "json",
        # Not in smg's factory: smg serves gpt-oss through its harmony pipeline, chosen when the model
        # id contains "gpt-oss" (`routers/grpc/harmony/detector.rs`).
        "gpt-oss*": "gpt_oss",
    }
)

# smg's reasoning-parser factory (`crates/reasoning_parser/src/factory.rs`), verbatim and in
# order, plus the parsers smg 1.13 added (marked): the first pattern that occurs in the model id
# (case-insensitively) wins.
REASONING_MODEL_PATTERNS: Final[tuple[tuple[str, str], ...]] = (
    ("deepseek-r1", "deepseek_r1"),
    ("deepseek-v4.1", "deepseek_v41"),  # smg 1.13's V4.1 parser
    ("deepseek-v3.1", "deepseek_v31"),
    ("deepseek-v3-1", "deepseek_v31"),
    ("qwen3-thinking", "qwen3_thinking"),
    ("qwen-thinking", "qwen3_thinking"),
    ("qwen3", "qwen3"),
    ("qwen", "qwen3"),
    ("glm45", "glm45"),
    ("glm47", "glm45"),
    ("glm-5", "glm45"),
    ("kimi-k2-thinking", "kimi_thinking"),
    ("kimi-k2.5", "kimi_k25"),
    ("kimi-k3", "kimi_k3"),
    ("kimi_k3", "kimi_k3"),
    ("kimi", "kimi"),
    ("step3", "step3"),
    ("minimax-m3", "minimax_m3"),  # smg 1.13's M3 parser: before the M2 patterns
    ("minimax", "minimax"),
    ("minimax-m2", "minimax"),
    ("mm-m2", "minimax"),
    ("command-r", "cohere_cmd"),
    ("command-a", "cohere_cmd"),
    ("c4ai-command", "cohere_cmd"),
    ("cohere", "cohere_cmd"),
    ("nemotron-nano", "nano_v3"),
    ("nemotron-super", "nano_v3"),
    ("nano-v3", "nano_v3"),
    ("inkling", "inkling"),
    ("gemma-4", "gemma4"),  # smg 1.13's Gemma 4 parser (its thinking channel)
    ("gemma4", "gemma4"),
    # Not in smg's factory: its harmony pipeline, chosen for model ids containing "gpt-oss".
    ("gpt-oss", "gpt_oss"),
)


@dataclass(frozen=True, slots=True)
class ParserSelection:
    """The parsers to build per request (canonical format names, `None` for none), why each was
    chosen (for the start-up log), and warnings for the operator."""

    tool_call_parser: str | None
    reasoning_parser: str | None
    tool_call_source: str = ""
    reasoning_source: str = ""
    warnings: tuple[str, ...] = field(default=())


def select_parsers(
    *,
    tool_call_flag: str | None,
    reasoning_flag: str | None,
    engine_tool_call_parser: str | None,
    engine_reasoning_parser: str | None,
    model_path: str | None,
    served_model_name: str | None,
) -> ParserSelection:
    """Pick both parsers; raises `UnknownToolCallParser` / `UnknownReasoningParser` (both
    `ValueError`s, whose message lists every known name) for a flag value that names none."""
    warnings: list[str] = []
    models = [m for m in (model_path, served_model_name) if m]

    tool, tool_source = _choose(
        "tool-call",
        tool_call_flag,
        engine_tool_call_parser,
        models,
        KNOWN_TOOL_CALL_PARSERS,
        UnknownToolCallParser,
        tool_call_parser_for_model,
        warnings,
    )
    reasoning, reasoning_source = _choose(
        "reasoning",
        reasoning_flag,
        engine_reasoning_parser,
        models,
        KNOWN_REASONING_PARSERS,
        UnknownReasoningParser,
        reasoning_parser_for_model,
        warnings,
    )
    if tool == "gpt_oss" and reasoning != "gpt_oss":
        warnings.append(
            "the gpt_oss tool-call parser without the gpt_oss reasoning parser leaves "
            "harmony's analysis channel and markers in content"
        )
    return ParserSelection(tool, reasoning, tool_source, reasoning_source, tuple(warnings))


def _choose(
    kind: str,
    flag: str | None,
    engine: str | None,
    models: Sequence[str],
    known: MappingProxyType[str, str],
    unknown: type[ValueError],
    for_model: _ForModel,
    warnings: list[str],
) -> tuple[str | None, str]:
    if flag is not None and flag.strip():
        found = known.get(normalize_parser_name(flag))
        if found is None:
            raise unknown(f"unknown {kind} parser {flag!r} (--{kind}-parser); known: {', '.join(sorted(known))}")
        return found, f"--{kind}-parser {flag}"
    if engine is not None and engine.strip():
        found = known.get(normalize_parser_name(engine))
        if found is None:
            warnings.append(
                f"the engines report {kind} parser {engine!r}, which trio-direct does not "
                f"know; no {kind} parser (known: {', '.join(sorted(known))})"
            )
            return None, f"engine-reported {engine!r} (unknown)"
        return found, f"engine-reported {engine!r}"
    for model in models:
        match = for_model(model)
        if match is not None:
            return match[0], f"model {model!r} matches {match[1]!r}"
    return None, ""


class _ForModel(Protocol):
    def __call__(self, model: str) -> tuple[str, str] | None: ...


def tool_call_parser_for_model(model: str) -> tuple[str, str] | None:
    """`(format, pattern)` by smg's tool-parser mapping for a model id, or None."""
    exact = TOOL_CALL_MODEL_PATTERNS.get(model)
    if exact is not None:
        return _known_tool_call_format(exact, model)
    lowered = model.lower()
    best: tuple[int, str, str] | None = None
    for pattern, name in TOOL_CALL_MODEL_PATTERNS.items():
        if not pattern.endswith("*"):
            continue
        stem = pattern[:-1]
        if stem.lower() in lowered and (best is None or len(stem) > best[0]):
            best = (len(stem), pattern, name)
    return None if best is None else _known_tool_call_format(best[2], best[1])


def _known_tool_call_format(name: str, pattern: str) -> tuple[str, str] | None:
    found = KNOWN_TOOL_CALL_PARSERS.get(name)
    return None if found is None else (found, pattern)


def reasoning_parser_for_model(model: str) -> tuple[str, str] | None:
    """`(format, pattern)` by smg's reasoning-parser patterns for a model id, or None."""
    lowered = model.lower()
    for pattern, name in REASONING_MODEL_PATTERNS:
        if pattern in lowered:
            return KNOWN_REASONING_PARSERS[name], pattern
    return None


class _SpecialTokens(Protocol):
    @property
    def requires_special_tokens(self) -> bool: ...


def skip_special_tokens(requested: bool, parsers: Iterable[_SpecialTokens | None]) -> bool:
    """The detokenizer's `skip_special_tokens` for a choice: the request's value, unless one of
    the choice's parsers reads markup made of special tokens (then they must reach it)."""
    return requested and not any(p is not None and p.requires_special_tokens for p in parsers)
