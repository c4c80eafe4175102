"""OpenAI Responses API bytes: the `response` object, its output items, and the stream's events.

A stream is a sequence of named SSE events (``event: response.output_text.delta`` + ``data:``),
each carrying its `sequence_number`; there is no ``[DONE]``. The per-token events are msgspec
Structs encoded straight into the SSE buffer; the rarer ones (an item opening or closing, the
lifecycle events carrying the whole response) are plain dicts. Shapes follow OpenAI's reference and
are checked against the `openai` SDK's models in the tests.
"""

from __future__ import annotations

from typing import Any

import msgspec

from trio_direct.core.errors import ApiError
from trio_direct.core.sse import sse_event
from trio_direct.openai.chat_bodies import UsageCounts

__all__ = [
    "arguments_delta_event",
    "deleted_body",
    "encode",
    "function_call_item",
    "message_item",
    "output_text_part",
    "reasoning_delta_event",
    "reasoning_item",
    "reasoning_text_part",
    "response_error",
    "response_usage",
    "sse_event",
    "text_delta_event",
]

_encoder = msgspec.json.Encoder()


class _TextDelta(msgspec.Struct, tag_field="type", tag="response.output_text.delta", kw_only=True):
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    delta: str
    logprobs: list[Any]


class _ReasoningDelta(msgspec.Struct, tag_field="type", tag="response.reasoning_text.delta", kw_only=True):
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    delta: str


class _ArgumentsDelta(msgspec.Struct, tag_field="type", tag="response.function_call_arguments.delta", kw_only=True):
    sequence_number: int
    item_id: str
    output_index: int
    delta: str


_NO_LOGPROBS: list[Any] = []


def _delta_sse(name: bytes, payload: msgspec.Struct) -> bytes:
    buffer = bytearray(b"event: ")
    buffer += name
    buffer += b"\ndata: "
    _encoder.encode_into(payload, buffer, len(buffer))
    buffer += b"\n\n"
    return bytes(buffer)


def text_delta_event(sequence_number: int, item_id: str, output_index: int, delta: str) -> bytes:
    payload = _TextDelta(
        sequence_number=sequence_number,
        item_id=item_id,
        output_index=output_index,
        content_index=0,
        delta=delta,
        logprobs=_NO_LOGPROBS,
    )
    return _delta_sse(b"response.output_text.delta", payload)


def reasoning_delta_event(sequence_number: int, item_id: str, output_index: int, delta: str) -> bytes:
    payload = _ReasoningDelta(
        sequence_number=sequence_number, item_id=item_id, output_index=output_index, content_index=0, delta=delta
    )
    return _delta_sse(b"response.reasoning_text.delta", payload)


def arguments_delta_event(sequence_number: int, item_id: str, output_index: int, delta: str) -> bytes:
    payload = _ArgumentsDelta(sequence_number=sequence_number, item_id=item_id, output_index=output_index, delta=delta)
    return _delta_sse(b"response.function_call_arguments.delta", payload)


# ----------------------------------------------------------------------------------------------
# Output items


def output_text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def reasoning_text_part(text: str) -> dict[str, Any]:
    return {"type": "reasoning_text", "text": text}


def message_item(item_id: str, status: str, text: str | None) -> dict[str, Any]:
    """An assistant `message` item; `text` None: just opened (no content part yet)."""
    content = [] if text is None else [output_text_part(text)]
    return {"id": item_id, "type": "message", "status": status, "role": "assistant", "content": content}


def reasoning_item(item_id: str, status: str, text: str | None) -> dict[str, Any]:
    """A `reasoning` item with the model's reasoning as `reasoning_text` content (no summary)."""
    content = [] if text is None else [reasoning_text_part(text)]
    return {"id": item_id, "type": "reasoning", "status": status, "summary": [], "content": content}


def function_call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "function_call",
        "status": status,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
    }


# ----------------------------------------------------------------------------------------------
# Usage, errors, deletion


def response_usage(usage: UsageCounts) -> dict[str, Any]:
    """The Responses `usage` object: cached input tokens and reasoning tokens in their details."""
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    }


def response_error(error: ApiError) -> dict[str, Any]:
    """A failed response's `error` (OpenAI's codes: rate_limit_exceeded, else server_error)."""
    code = "rate_limit_exceeded" if error.status == 429 else "server_error"
    return {"code": code, "message": error.message}


def deleted_body(response_id: str) -> bytes:
    """`DELETE /v1/responses/{id}`: OpenAI's deletion object."""
    return _encoder.encode({"id": response_id, "object": "response.deleted", "deleted": True})


def encode(payload: dict[str, Any]) -> bytes:
    return _encoder.encode(payload)
