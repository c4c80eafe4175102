"""Anthropic Messages request bodies (`POST /v1/messages`, `/v1/messages/count_tokens`): typed
schemas and their validation.

`decode_messages_request` turns body bytes into a `MessagesRequest` and rejects, with a 400 whose
message names the field the way Anthropic's API does (``messages.0.content.1.type: ...``), anything
malformed or out of range, and every block or tool this text-only server cannot honour (images,
documents, server tools), rather than dropping it. Unknown keys are ignored, as Anthropic does;
`cache_control` is accepted everywhere and means nothing here (the engines cache prefixes on their
own). SGLang's sampling extensions (`ignore_eos`, `min_tokens`, `repetition_penalty`, ...) are
accepted as on chat (`openai.extensions`).
"""

from __future__ import annotations

import math
import re
from typing import Any, Literal

import msgspec

from trio_direct.core import json_body
from trio_direct.core.errors import ApiError, invalid_request
from trio_direct.openai.extensions import SGLangExtensions

__all__ = [
    "CountTokensRequest",
    "MessageParam",
    "MessagesRequest",
    "decode_count_tokens_request",
    "decode_messages_request",
]

#: Anthropic's documented minimum thinking budget.
MIN_THINKING_BUDGET = 1024
INT32_MAX = 2**31 - 1

# ----------------------------------------------------------------------------------------------
# Content blocks


class TextBlock(msgspec.Struct, tag_field="type", tag="text", kw_only=True):
    text: str
    cache_control: dict[str, Any] | None = None
    citations: list[Any] | None = None


class ImageBlock(msgspec.Struct, tag_field="type", tag="image", kw_only=True):
    source: dict[str, Any]


class DocumentBlock(msgspec.Struct, tag_field="type", tag="document", kw_only=True):
    source: dict[str, Any]


class ToolUseBlock(msgspec.Struct, tag_field="type", tag="tool_use", kw_only=True):
    id: str
    name: str
    input: dict[str, Any]
    cache_control: dict[str, Any] | None = None


class ToolResultBlock(msgspec.Struct, tag_field="type", tag="tool_result", kw_only=True):
    tool_use_id: str
    content: str | list[TextBlock | ImageBlock | DocumentBlock] | None = None
    is_error: bool = False
    cache_control: dict[str, Any] | None = None


class ThinkingBlock(msgspec.Struct, tag_field="type", tag="thinking", kw_only=True):
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(msgspec.Struct, tag_field="type", tag="redacted_thinking", kw_only=True):
    data: str


ContentBlock = (
    TextBlock | ImageBlock | DocumentBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock
)


class MessageParam(msgspec.Struct, kw_only=True):
    role: Literal["user", "assistant"]
    content: str | list[ContentBlock]


# ----------------------------------------------------------------------------------------------
# Tools, thinking, structured output


class Tool(msgspec.Struct, kw_only=True):
    """A client tool (`type` absent or "custom"); Anthropic's server tools have other types."""

    name: str
    input_schema: dict[str, Any]
    description: str | None = None
    type: str | None = None
    cache_control: dict[str, Any] | None = None
    strict: bool | None = None


class ToolChoiceAuto(msgspec.Struct, tag_field="type", tag="auto", kw_only=True):
    disable_parallel_tool_use: bool = False


class ToolChoiceAny(msgspec.Struct, tag_field="type", tag="any", kw_only=True):
    disable_parallel_tool_use: bool = False


class ToolChoiceTool(msgspec.Struct, tag_field="type", tag="tool", kw_only=True):
    name: str
    disable_parallel_tool_use: bool = False


class ToolChoiceNone(msgspec.Struct, tag_field="type", tag="none", kw_only=True):
    pass


ToolChoice = ToolChoiceAuto | ToolChoiceAny | ToolChoiceTool | ToolChoiceNone


class ThinkingEnabled(msgspec.Struct, tag_field="type", tag="enabled", kw_only=True):
    budget_tokens: int
    display: str | None = None


class ThinkingAdaptive(msgspec.Struct, tag_field="type", tag="adaptive", kw_only=True):
    display: str | None = None


class ThinkingDisabled(msgspec.Struct, tag_field="type", tag="disabled", kw_only=True):
    pass


Thinking = ThinkingEnabled | ThinkingAdaptive | ThinkingDisabled


class JsonOutputFormat(msgspec.Struct, tag_field="type", tag="json_schema", kw_only=True):
    schema: dict[str, Any]


class OutputConfig(msgspec.Struct, kw_only=True):
    format: JsonOutputFormat | None = None
    effort: str | None = None


class Metadata(msgspec.Struct, kw_only=True):
    user_id: str | None = None


# ----------------------------------------------------------------------------------------------
# Requests


class CountTokensRequest(SGLangExtensions, kw_only=True):
    """`POST /v1/messages/count_tokens`: what shapes the prompt. (Of the extensions only
    `chat_template_kwargs` matters here; the others are accepted for the same body to count.)"""

    model: str
    messages: list[MessageParam]
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None


class MessagesRequest(CountTokensRequest, kw_only=True):
    """`POST /v1/messages`."""

    max_tokens: int
    stream: bool = False
    stop_sequences: list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    metadata: Metadata | None = None
    output_config: OutputConfig | None = None
    service_tier: str | None = None


# ----------------------------------------------------------------------------------------------
# Decoding

_MALFORMED_JSON = "The request body is not valid JSON."
_TOO_DEEP = "The JSON body of the request is nested too deeply."

#: Fields of Anthropic's API that need capabilities this server does not have.
_UNSUPPORTED = {
    "container": "'container' (code execution) is not supported.",
    "mcp_servers": "'mcp_servers' is not supported.",
    "context_management": "'context_management' is not supported.",
}


def decode_messages_request(body: bytes) -> MessagesRequest:
    """Parse and validate a Messages body; raises `ApiError` (400) on any problem."""
    raw = decode_object(body)
    for key, reason in _UNSUPPORTED.items():
        if key in raw:
            raise invalid_request(f"{key}: {reason}", param=key, code="unsupported_parameter")
    request = _convert(raw, MessagesRequest)
    _check_prompt_fields(request)
    _check_range(request.max_tokens, "max_tokens", 1, INT32_MAX)
    _check_range(request.temperature, "temperature", 0, 1)
    _check_range(request.top_p, "top_p", 0, 1, low_open=True)
    _check_range(request.top_k, "top_k", 0, INT32_MAX)
    for i, stop in enumerate(request.stop_sequences or ()):
        if not stop:
            raise invalid_request(
                f"stop_sequences.{i}: stop sequences must not be empty.", param=f"stop_sequences[{i}]"
            )
    thinking = request.thinking
    if isinstance(thinking, ThinkingEnabled):
        if thinking.budget_tokens < MIN_THINKING_BUDGET:
            raise invalid_request(
                f"thinking.enabled.budget_tokens: Input should be greater than or equal to {MIN_THINKING_BUDGET}",
                param="thinking.budget_tokens",
            )
        if thinking.budget_tokens >= request.max_tokens:
            raise invalid_request(
                "`max_tokens` must be greater than `thinking.budget_tokens`.", param="thinking.budget_tokens"
            )
    return request


def decode_count_tokens_request(body: bytes) -> CountTokensRequest:
    """Parse and validate a count_tokens body; raises `ApiError` (400) on any problem."""
    request = _convert(decode_object(body), CountTokensRequest)
    _check_prompt_fields(request)
    return request


def _check_prompt_fields(request: CountTokensRequest) -> None:
    if not request.messages:
        raise invalid_request("messages: at least one message is required", param="messages")
    for i, message in enumerate(request.messages):
        if isinstance(message.content, str):
            continue
        allowed = _BLOCKS_BY_ROLE[message.role]
        for j, block in enumerate(message.content):
            where = f"messages[{i}].content[{j}]"
            if isinstance(block, DocumentBlock) or (isinstance(block, ImageBlock) and message.role != "user"):
                raise _unsupported_block(where, block)
            if isinstance(block, ToolResultBlock) and isinstance(block.content, list):
                for k, part in enumerate(block.content):
                    if not isinstance(part, TextBlock):
                        raise _unsupported_block(f"{where}.content[{k}]", part)
            if not isinstance(block, allowed):
                raise invalid_request(
                    f"{_dotted(where)}: '{_tag(block)}' blocks are not allowed in {message.role} messages.",
                    param=where,
                )
    for i, tool in enumerate(request.tools or ()):
        if tool.type not in (None, "custom"):
            raise invalid_request(
                f"tools.{i}.type: server tools ('{tool.type}') are not supported; only client tools are.",
                param=f"tools[{i}].type",
                code="unsupported_parameter",
            )
    names = [tool.name for tool in request.tools or ()]
    choice = request.tool_choice
    if isinstance(choice, ToolChoiceTool) and choice.name not in names:
        raise invalid_request(f"tool_choice.name: no tool named '{choice.name}' in 'tools'.", param="tool_choice")
    if isinstance(choice, ToolChoiceAny) and not names:
        raise invalid_request("tool_choice: 'any' needs at least one tool in 'tools'.", param="tool_choice")


_BLOCKS_BY_ROLE: dict[str, tuple[type, ...]] = {
    "user": (TextBlock, ImageBlock, ToolResultBlock),
    "assistant": (TextBlock, ToolUseBlock, ThinkingBlock, RedactedThinkingBlock),
}


def _tag(block: msgspec.Struct) -> str:
    return str(type(block).__struct_config__.tag)


def _dotted(path: str) -> str:
    """`messages[0].content[1]` as Anthropic writes it: `messages.0.content.1`."""
    return _INDEX.sub(r".\1", path)


def _unsupported_block(where: str, block: msgspec.Struct) -> ApiError:
    return invalid_request(
        f"{_dotted(where)}: '{_tag(block)}' content is not supported: this server takes text only.",
        param=where,
        code="unsupported_parameter",
    )


def decode_object(body: bytes) -> dict[str, Any]:
    return json_body.decode_object(body, BODY_RULES)


_LOCATED = re.compile(r"^(?P<what>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.DOTALL)
_MISSING = re.compile(r"^Object missing required field `(?P<field>[^`]+)`$")
_INDEX = re.compile(r"\[(\d+)\]")


def _convert(raw: dict[str, Any], request_type: type[Any]) -> Any:
    return json_body.convert_object(raw, request_type, BODY_RULES)


def validation_error(text: str) -> ApiError:
    """msgspec's message in Anthropic's style: the field's dotted path, then what is wrong with it."""
    located = _LOCATED.match(text)
    assert located is not None  # the pattern matches any string
    what, path = located["what"], (located["path"] or "").lstrip(".")
    if missing := _MISSING.match(what):
        path = f"{path}.{missing['field']}" if path else missing["field"]
        what = "Field required"
    what = what.replace("`", "")
    message = f"{_dotted(path)}: {what}" if path else what
    return invalid_request(message, param=path or None)


def _check_range(value: float | None, param: str, low: float, high: float, *, low_open: bool = False) -> None:
    if value is None:
        return
    too_low = value <= low if low_open else value < low
    if too_low or value > high or math.isnan(value):
        interval = f"{'(' if low_open else '['}{low}, {high}]"
        raise invalid_request(f"{param}: expected a value in {interval}, but got {value}.", param=param)


#: How a bad body is worded on the Messages routes (`core.json_body`).
BODY_RULES = json_body.BodyRules(_MALFORMED_JSON, _TOO_DEEP, validation_error)
