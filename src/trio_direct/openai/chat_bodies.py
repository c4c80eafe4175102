"""OpenAI response bodies and SSE chunks, built straight to bytes.

Streaming builders run once per token per choice, so each is one msgspec Struct encoded by a
shared `Encoder` into a buffer that already holds the `data: ` prefix: no intermediate dicts, no
second copy of the JSON. Shapes follow OpenAI exactly (checked against the `openai` SDK's models in
the tests): `usage` is `null` on every chunk except the final usage chunk (`choices: []`) that
`stream_options.include_usage` asks for, and `system_fingerprint` is `null`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import msgspec

from trio_direct.core.errors import ApiError
from trio_direct.openai.errors import openai_error_body

DONE = b"data: [DONE]\n\n"

_encoder = msgspec.json.Encoder()
_SSE_PREFIX = b"data: "
_SSE_SUFFIX = b"\n\n"


def _sse(payload: msgspec.Struct) -> bytes:
    buffer = bytearray(_SSE_PREFIX)
    _encoder.encode_into(payload, buffer, len(_SSE_PREFIX))
    buffer += _SSE_SUFFIX
    return bytes(buffer)


# ----------------------------------------------------------------------------------------------
# Usage


class _PromptTokensDetails(msgspec.Struct):
    cached_tokens: int


class _CompletionTokensDetails(msgspec.Struct):
    reasoning_tokens: int


class _UsageBody(msgspec.Struct, omit_defaults=True):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: _PromptTokensDetails
    completion_tokens_details: _CompletionTokensDetails | None = None


class UsageCounts(Protocol):
    """Token counts of one request (`core.plan.Usage`)."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    reasoning_tokens: int


def usage_body(usage: UsageCounts) -> _UsageBody:
    """The OpenAI `usage` object; `completion_tokens_details` only when there was reasoning."""
    return _UsageBody(
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
        total_tokens=usage.prompt_tokens + usage.completion_tokens,
        prompt_tokens_details=_PromptTokensDetails(usage.cached_tokens),
        completion_tokens_details=(
            _CompletionTokensDetails(usage.reasoning_tokens) if usage.reasoning_tokens else None
        ),
    )


def _usage_body(usage: UsageCounts | None) -> _UsageBody | None:
    return None if usage is None else usage_body(usage)


# ----------------------------------------------------------------------------------------------
# Streaming chunks


class _ChatChunkChoice(msgspec.Struct):
    index: int
    delta: dict[str, Any]
    logprobs: Any
    finish_reason: str | None


class _ChatChunk(msgspec.Struct, kw_only=True):
    id: str
    object: str = "chat.completion.chunk"
    created: int
    model: str
    system_fingerprint: str | None = None
    choices: list[_ChatChunkChoice]
    usage: _UsageBody | None = None


class _CompletionChunkChoice(msgspec.Struct):
    index: int
    text: str
    logprobs: Any
    finish_reason: str | None


class _CompletionChunk(msgspec.Struct, kw_only=True):
    id: str
    object: str = "text_completion"
    created: int
    model: str
    system_fingerprint: str | None = None
    choices: list[_CompletionChunkChoice]
    usage: _UsageBody | None = None


def chat_chunk(
    id: str,
    created: int,
    model: str,
    index: int,
    delta: dict[str, Any],
    finish_reason: str | None = None,
    usage: UsageCounts | None = None,
    logprobs: Any = None,
) -> bytes:
    """One `chat.completion.chunk` SSE event for choice `index`.

    `delta` is the OpenAI delta object (`{"content": ...}`, `{"reasoning_content": ...}`,
    `{"tool_calls": [...]}`); `usage` is for `continuous_usage_stats`; `logprobs` is the
    `{"content": [...]}` object for this delta.
    """
    choice = _ChatChunkChoice(index, delta, logprobs, finish_reason)
    return _sse(_ChatChunk(id=id, created=created, model=model, choices=[choice], usage=_usage_body(usage)))


def chat_role_chunk(id: str, created: int, model: str, index: int) -> bytes:
    """The first chunk of each choice, announcing the assistant role as OpenAI does."""
    return chat_chunk(id, created, model, index, {"role": "assistant", "content": ""})


def completion_chunk(
    id: str,
    created: int,
    model: str,
    index: int,
    text: str,
    finish_reason: str | None = None,
    usage: UsageCounts | None = None,
    logprobs: Any = None,
) -> bytes:
    """One `text_completion` SSE event for choice `index`."""
    choice = _CompletionChunkChoice(index, text, logprobs, finish_reason)
    return _sse(_CompletionChunk(id=id, created=created, model=model, choices=[choice], usage=_usage_body(usage)))


def usage_chunk(id: str, created: int, model: str, usage: UsageCounts, *, chat: bool = True) -> bytes:
    """The final `choices: []` chunk carrying usage (`stream_options.include_usage`)."""
    if chat:
        return _sse(_ChatChunk(id=id, created=created, model=model, choices=[], usage=usage_body(usage)))
    return _sse(_CompletionChunk(id=id, created=created, model=model, choices=[], usage=usage_body(usage)))


def error_chunk(error: ApiError) -> bytes:
    """A mid-stream failure as OpenAI sends it: a `data:` event holding the error envelope."""
    return b"".join((_SSE_PREFIX, openai_error_body(error), _SSE_SUFFIX))


# ----------------------------------------------------------------------------------------------
# Unary bodies


class ResponseMessage(msgspec.Struct, tag_field="role", tag="assistant", kw_only=True, omit_defaults=True):
    """The assistant message of a non-streaming chat choice; `content` is always present (maybe null)."""

    content: str | None
    reasoning_content: str | None = None
    tool_calls: list[Any] | None = None


class ChatChoice(msgspec.Struct, kw_only=True):
    index: int
    message: ResponseMessage
    logprobs: Any = None
    finish_reason: str | None


class CompletionChoice(msgspec.Struct, kw_only=True):
    index: int
    text: str
    logprobs: Any = None
    finish_reason: str | None


class _ChatCompletion(msgspec.Struct, kw_only=True):
    id: str
    object: str = "chat.completion"
    created: int
    model: str
    system_fingerprint: str | None = None
    choices: Sequence[ChatChoice]
    usage: _UsageBody


class _Completion(msgspec.Struct, kw_only=True):
    id: str
    object: str = "text_completion"
    created: int
    model: str
    system_fingerprint: str | None = None
    choices: Sequence[CompletionChoice]
    usage: _UsageBody


def chat_completion(id: str, created: int, model: str, choices: Sequence[ChatChoice], usage: UsageCounts) -> bytes:
    """A non-streaming `chat.completion` body."""
    return _encoder.encode(
        _ChatCompletion(id=id, created=created, model=model, choices=choices, usage=usage_body(usage))
    )


def completion(id: str, created: int, model: str, choices: Sequence[CompletionChoice], usage: UsageCounts) -> bytes:
    """A non-streaming `text_completion` body."""
    return _encoder.encode(_Completion(id=id, created=created, model=model, choices=choices, usage=usage_body(usage)))


# ----------------------------------------------------------------------------------------------
# Models


class ModelCard(msgspec.Struct, tag_field="object", tag="model", kw_only=True, omit_defaults=True):
    id: str
    created: int
    owned_by: str
    #: vLLM's fields: the model the name stands for (the engines' model path) and, for an adapter,
    #: its base model (null for a base model; always written, as vLLM does).
    root: str
    parent: str | None
    max_model_len: int | None = None


class _ModelList(msgspec.Struct, tag_field="object", tag="list"):
    data: list[ModelCard]


def model_card(
    model_id: str,
    created: int,
    owned_by: str = "trio-direct",
    max_model_len: int | None = None,
    root: str | None = None,
    parent: str | None = None,
) -> ModelCard:
    """One `model` object; `max_model_len` (vLLM's extension) only when known; `root` defaults to the id."""
    return ModelCard(
        id=model_id,
        created=created,
        owned_by=owned_by,
        root=root or model_id,
        parent=parent,
        max_model_len=max_model_len,
    )


def models_list(cards: Sequence[ModelCard]) -> bytes:
    """The `GET /v1/models` body."""
    return _encoder.encode(_ModelList(list(cards)))


def model_body(card: ModelCard) -> bytes:
    """The `GET /v1/models/{model}` body."""
    return _encoder.encode(card)
