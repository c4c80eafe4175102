"""Anthropic Messages bytes: the `message` object, its content blocks and the stream's events.

A stream is named SSE events (``event: content_block_delta`` + ``data:``): `message_start`, a
`ping`, then per content block `content_block_start`, `content_block_delta`s and
`content_block_stop`, then `message_delta` (stop reason, final usage) and `message_stop`. The
per-token deltas are msgspec Structs encoded straight into the SSE buffer. Shapes follow Anthropic's
reference and are checked against the `anthropic` SDK's models in the tests.

Usage follows Anthropic's accounting: `input_tokens` are the prompt tokens *not* read from the
cache, `cache_read_input_tokens` those the engine had cached (their sum is the prompt).
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

from trio_direct.core.sse import sse_event
from trio_direct.openai.chat_bodies import UsageCounts

__all__ = [
    "PING",
    "content_block_delta",
    "message_usage",
    "sse_event",
    "stop_reason",
    "text_block",
    "thinking_block",
    "tool_use_block",
    "tool_use_input",
]

_encoder = msgspec.json.Encoder()


PING = b'event: ping\ndata: {"type":"ping"}\n\n'


class _TextDelta(msgspec.Struct, tag_field="type", tag="text_delta"):
    text: str


class _ThinkingDelta(msgspec.Struct, tag_field="type", tag="thinking_delta"):
    thinking: str


class _InputJsonDelta(msgspec.Struct, tag_field="type", tag="input_json_delta"):
    partial_json: str


class _BlockDelta(msgspec.Struct, tag_field="type", tag="content_block_delta"):
    index: int
    delta: _TextDelta | _ThinkingDelta | _InputJsonDelta


_DELTAS: dict[str, type[_TextDelta | _ThinkingDelta | _InputJsonDelta]] = {
    "text": _TextDelta,
    "reasoning": _ThinkingDelta,
    "tool_call": _InputJsonDelta,
}


def content_block_delta(index: int, kind: str, piece: str) -> bytes:
    """`content_block_delta` for block `index`: a `text_delta`, `thinking_delta` or `input_json_delta`."""
    buffer = bytearray(b"event: content_block_delta\ndata: ")
    _encoder.encode_into(_BlockDelta(index, _DELTAS[kind](piece)), buffer, len(buffer))
    buffer += b"\n\n"
    return bytes(buffer)


# ----------------------------------------------------------------------------------------------
# Content blocks


def text_block(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def thinking_block(thinking: str) -> dict[str, Any]:
    """A `thinking` block. Its `signature` is empty: the reasoning is the model's own text, and
    nothing here signs it (clients send it back as it is; it is read back as reasoning)."""
    return {"type": "thinking", "thinking": thinking, "signature": ""}


def tool_use_block(call_id: str, name: str, tool_input: dict[str, Any]) -> dict[str, Any]:
    return {"type": "tool_use", "id": call_id, "name": name, "input": tool_input}


def tool_use_input(arguments: str) -> dict[str, Any]:
    """A call's arguments JSON as the `input` object; {} when the model's JSON is not an object."""
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


# ----------------------------------------------------------------------------------------------
# Stop reason, usage


def stop_reason(finish_reason: str | None, matched_stop: int | str | None) -> tuple[str, str | None]:
    """`(stop_reason, stop_sequence)` from a choice's finish, as SGLang's gateway maps them."""
    if finish_reason == "tool_calls":
        return "tool_use", None
    if finish_reason == "length":
        return "max_tokens", None
    if isinstance(matched_stop, str):
        return "stop_sequence", matched_stop
    return "end_turn", None


def message_usage(usage: UsageCounts) -> dict[str, Any]:
    return {
        "input_tokens": usage.prompt_tokens - usage.cached_tokens,
        "output_tokens": usage.completion_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": usage.cached_tokens,
    }


def encode(payload: dict[str, Any]) -> bytes:
    return _encoder.encode(payload)
