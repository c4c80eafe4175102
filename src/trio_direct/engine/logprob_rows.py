"""Logprob rows of the SMG family's gRPC messages, as `TokenLogprob`s.

SGLang's SMG API (`sglang.grpc.scheduler`) and vLLM's (`vllm.grpc.engine`) declare the same
`OutputLogProbs` and `InputLogProbs` shapes in their own proto packages, so one decoder serves both
adapters: the messages are read by their fields, whatever package generated them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from trio_direct.engine.types import TokenLogprob

__all__ = ["output_rows", "prompt_rows"]


def _tops(top_logprobs: Sequence[Any], i: int) -> tuple[tuple[int, float], ...]:
    return tuple(zip(top_logprobs[i].token_ids, top_logprobs[i].values, strict=False)) if i < len(top_logprobs) else ()


def output_rows(rows: Any) -> list[TokenLogprob]:
    """An `OutputLogProbs`: one row per generated token, each with its top alternatives."""
    tops = list(rows.top_logprobs)
    return [
        TokenLogprob(token_id, logprob, _tops(tops, i))
        for i, (logprob, token_id) in enumerate(zip(rows.token_logprobs, rows.token_ids, strict=False))
    ]


def prompt_rows(rows: Any) -> list[TokenLogprob]:
    """An `InputLogProbs`: the prompt's rows; the first token's value is unset (nothing precedes it,
    so it has no logprob)."""
    tops = list(rows.top_logprobs)
    return [
        TokenLogprob(token_id, value.value if value.HasField("value") else None, _tops(tops, i))
        for i, (value, token_id) in enumerate(zip(rows.token_logprobs, rows.token_ids, strict=False))
    ]
