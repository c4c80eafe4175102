"""OpenAI's two logprobs shapes, from the engine's per-token rows.

Chat: ``{"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}], "refusal": null}``.
Legacy completions: ``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from trio_direct.engine.types import TokenLogprob

TokenText = Callable[[int], str]


def chat_logprobs(rows: Sequence[TokenLogprob], token_text: TokenText) -> dict[str, Any]:
    def entry(token_id: int, logprob: float | None) -> dict[str, Any]:
        text = token_text(token_id)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

    content = []
    for row in rows:
        item = entry(row.token_id, row.logprob)
        item["top_logprobs"] = [entry(token_id, logprob) for token_id, logprob in row.top]
        content.append(item)
    return {"content": content, "refusal": None}


def completion_logprobs(rows: Sequence[TokenLogprob], token_text: TokenText, offset: int) -> tuple[dict[str, Any], int]:
    """The legacy object for `rows`, whose first token starts at character `offset` of the choice's
    text; also returns the offset after the last token."""
    tokens, logprobs, tops, offsets = [], [], [], []
    for row in rows:
        text = token_text(row.token_id)
        tokens.append(text)
        logprobs.append(row.logprob)
        tops.append({token_text(t): lp for t, lp in row.top} if row.top else None)
        offsets.append(offset)
        offset += len(text)
    body = {"tokens": tokens, "token_logprobs": logprobs, "top_logprobs": tops, "text_offset": offsets}
    return body, offset
