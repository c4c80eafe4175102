"""What the Responses and Messages surfaces share: a conversation turned into the chat request that
plans it.

Both APIs are chat with another shape, as SGLang's gateway maps them: each surface writes its
input as OpenAI-style messages and tools plus its sampling fields (and SGLang's extensions) into a
chat body, and `chat_equivalent` validates that body with chat's own decoder. The surface then
plans it with `surfaces.chat.plan_chat`, so the chat template, the tokenizer, stop strings, guided
decoding, forced tool choices, the reasoning and tool-call parsers and every sampling rule are
chat's, never a copy.
"""

from __future__ import annotations

from typing import Any

import msgspec

from trio_direct.openai.requests import ChatCompletionRequest, decode_chat_request
from trio_direct.surfaces.output_blocks import OutputBlock

__all__ = ["assistant_message", "chat_equivalent", "chat_tool", "chat_tool_call"]


def chat_equivalent(body: dict[str, Any]) -> ChatCompletionRequest:
    """The chat request for `body` (a chat request's fields), validated as chat validates its own."""
    return decode_chat_request(msgspec.json.encode(body))


def chat_tool(
    name: str, description: str | None, parameters: dict[str, Any] | None, strict: bool | None = None
) -> dict:
    function: dict[str, Any] = {"name": name}
    if description is not None:
        function["description"] = description
    if parameters is not None:
        function["parameters"] = parameters
    if strict is not None:
        function["strict"] = strict
    return {"type": "function", "function": function}


def chat_tool_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def assistant_message(blocks: list[OutputBlock]) -> dict[str, Any]:
    """A turn's output blocks as the chat assistant message that continues the conversation."""
    reasoning = "".join(block.text for block in blocks if block.kind == "reasoning")
    text = "".join(block.text for block in blocks if block.kind == "text")
    calls = [chat_tool_call(b.call_id, b.name, b.text or "{}") for b in blocks if b.kind == "tool_call"]
    message: dict[str, Any] = {"role": "assistant"}
    if text or not calls:
        message["content"] = text
    if reasoning:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = calls
    return message
