"""OpenAI Responses request bodies (`POST /v1/responses`): typed schemas and their validation.

`decode_responses_request` turns body bytes into a `ResponsesRequest` and rejects, with an OpenAI
400 naming the `param` (``input[2].content[0].type``), anything malformed or out of range, and every
Responses feature this text-only server cannot honour (hosted tools, images and files, background
mode, ``truncation: "auto"``, ...), rather than dropping it. Unknown keys
are ignored as OpenAI does. Accepted and without effect: `include` (there is no encrypted reasoning
to include), `reasoning.summary` (reasoning is whatever the model writes, split out by the reasoning
parser), `prompt_cache_key`, `service_tier`, `stream_options`, `text.verbosity`.
SGLang's sampling extensions (`top_k`, `ignore_eos`, `min_tokens`, `stop`, ...) are accepted as on
chat (`openai.extensions`).
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from trio_direct.core.errors import invalid_request
from trio_direct.openai.extensions import SGLangExtensions
from trio_direct.openai.requests import INT32_MAX, decode_object, validation_error

__all__ = [
    "FunctionCallItem",
    "FunctionCallOutputItem",
    "FunctionTool",
    "InputItem",
    "MessageItem",
    "ReasoningItem",
    "ResponsesRequest",
    "check_metadata",
    "decode_items",
    "decode_responses_request",
]

MAX_METADATA_PAIRS = 16

# ----------------------------------------------------------------------------------------------
# Input items


class InputText(msgspec.Struct, tag_field="type", tag="input_text", kw_only=True):
    text: str


class OutputText(msgspec.Struct, tag_field="type", tag="output_text", kw_only=True):
    text: str
    annotations: list[Any] | None = None
    logprobs: list[Any] | None = None


class Refusal(msgspec.Struct, tag_field="type", tag="refusal", kw_only=True):
    refusal: str


class InputImage(msgspec.Struct, tag_field="type", tag="input_image", kw_only=True):
    image_url: str | None = None
    file_id: str | None = None
    detail: str | None = None


class InputFile(msgspec.Struct, tag_field="type", tag="input_file", kw_only=True):
    file_id: str | None = None
    file_data: str | None = None
    file_url: str | None = None
    filename: str | None = None


ContentPart = InputText | OutputText | Refusal | InputImage | InputFile


class MessageItem(msgspec.Struct, tag_field="type", tag="message", kw_only=True):
    """A message: the client's (user, system, developer) or an earlier assistant output."""

    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[ContentPart]
    id: str | None = None
    status: str | None = None


class FunctionCallItem(msgspec.Struct, tag_field="type", tag="function_call", kw_only=True):
    call_id: str
    name: str
    arguments: str
    id: str | None = None
    status: str | None = None


class FunctionCallOutputItem(msgspec.Struct, tag_field="type", tag="function_call_output", kw_only=True):
    call_id: str
    output: str | list[ContentPart]
    id: str | None = None
    status: str | None = None


class ReasoningText(msgspec.Struct, tag_field="type", tag="reasoning_text", kw_only=True):
    text: str


class SummaryText(msgspec.Struct, tag_field="type", tag="summary_text", kw_only=True):
    text: str


class ReasoningItem(msgspec.Struct, tag_field="type", tag="reasoning", kw_only=True):
    id: str | None = None
    summary: list[SummaryText] = []
    content: list[ReasoningText] | None = None
    encrypted_content: str | None = None
    status: str | None = None


class ItemReference(msgspec.Struct, tag_field="type", tag="item_reference", kw_only=True):
    id: str


InputItem = MessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem | ItemReference


# ----------------------------------------------------------------------------------------------
# Tools, tool choice, text format


class FunctionTool(msgspec.Struct, kw_only=True):
    """A function tool (`type: "function"`); hosted tools (web search, file search, ...) have other types."""

    type: str
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class FunctionToolChoice(msgspec.Struct, kw_only=True):
    type: str
    name: str | None = None


class TextFormatText(msgspec.Struct, tag_field="type", tag="text"):
    pass


class TextFormatJsonObject(msgspec.Struct, tag_field="type", tag="json_object"):
    pass


class TextFormatJsonSchema(msgspec.Struct, tag_field="type", tag="json_schema", kw_only=True):
    name: str
    schema: dict[str, Any]
    description: str | None = None
    strict: bool | None = None


TextFormat = TextFormatText | TextFormatJsonObject | TextFormatJsonSchema


class TextConfig(msgspec.Struct, kw_only=True):
    format: TextFormat | None = None
    verbosity: str | None = None


class ReasoningConfig(msgspec.Struct, kw_only=True):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None


# ----------------------------------------------------------------------------------------------
# The request


class ConversationRef(msgspec.Struct, kw_only=True):
    id: str


class ResponsesRequest(SGLangExtensions, kw_only=True):
    """`POST /v1/responses`."""

    model: str
    input: str | list[InputItem]
    instructions: str | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | FunctionToolChoice | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    store: bool = True
    stream: bool = False
    previous_response_id: str | None = None
    #: A conversation (``/v1/conversations``) whose items precede this input, and which this
    #: response's input and output items are appended to.
    conversation: str | ConversationRef | None = None
    truncation: Literal["auto", "disabled"] | None = None
    top_logprobs: int | None = None
    include: list[str] | None = None
    prompt_cache_key: str | None = None
    service_tier: str | None = None
    stream_options: dict[str, Any] | None = None
    #: SGLang's extension (not in OpenAI's Responses API): stop strings, as on chat.
    stop: str | list[str] | None = None


#: Responses features that need capabilities this server does not have: refused, never dropped.
_UNSUPPORTED = {
    "background": "'background' mode is not supported: responses are served while the client waits.",
    "prompt": "'prompt' (stored prompt templates) is not supported.",
    "max_tool_calls": "'max_tool_calls' is not supported (no hosted tools run here).",
}


def decode_responses_request(body: bytes) -> ResponsesRequest:
    """Parse and validate a Responses body; raises `ApiError` (400) on any problem."""
    raw = decode_object(body)
    for key, reason in _UNSUPPORTED.items():
        value = raw.get(key)
        if value is not None and value is not False:
            raise invalid_request(reason, param=key, code="unsupported_parameter")
    items = raw.get("input")
    if isinstance(items, list):
        # An "easy" input message ({"role": ..., "content": ...}) may leave out its type.
        raw["input"] = [
            {**item, "type": "message"} if isinstance(item, dict) and "type" not in item and "role" in item else item
            for item in items
        ]
    try:
        request = msgspec.convert(raw, ResponsesRequest)
    except msgspec.ValidationError as exc:
        raise validation_error(str(exc)) from None
    except RecursionError:
        raise invalid_request("The JSON body of your request is nested too deeply.") from None
    _check(request)
    return request


def _check(request: ResponsesRequest) -> None:
    if isinstance(request.input, str):
        if not request.input:
            raise invalid_request("Invalid value for 'input': it must not be empty.", param="input")
    else:
        if not request.input and request.previous_response_id is None:
            raise invalid_request("Invalid value for 'input': expected at least one item.", param="input")
        for i, item in enumerate(request.input):
            _check_item(item, f"input[{i}]")
    for i, tool in enumerate(request.tools or ()):
        if tool.type != "function":
            raise invalid_request(
                f"Tools of type '{tool.type}' are not supported: only function tools are.",
                param=f"tools[{i}].type",
                code="unsupported_parameter",
            )
        if not tool.name:
            raise invalid_request(f"Missing required parameter: 'tools[{i}].name'.", param=f"tools[{i}].name")
    choice = request.tool_choice
    if isinstance(choice, FunctionToolChoice):
        if choice.type != "function":
            raise invalid_request(
                f"tool_choice of type '{choice.type}' is not supported: use 'none', 'auto', 'required' or a function.",
                param="tool_choice.type",
                code="unsupported_parameter",
            )
        if not choice.name:
            raise invalid_request("Missing required parameter: 'tool_choice.name'.", param="tool_choice.name")
    if request.max_output_tokens is not None and not 1 <= request.max_output_tokens <= INT32_MAX:
        raise invalid_request(
            f"Invalid value for 'max_output_tokens': expected a value in [1, {INT32_MAX}], "
            f"but got {request.max_output_tokens}.",
            param="max_output_tokens",
        )
    if request.conversation is not None and request.previous_response_id is not None:
        raise invalid_request(
            "'previous_response_id' cannot be used together with 'conversation'.", param="conversation"
        )
    if request.truncation == "auto":
        raise invalid_request(
            "'truncation: auto' is not supported: a conversation that does not fit the context is refused.",
            param="truncation",
            code="unsupported_parameter",
        )
    if request.top_logprobs:
        raise invalid_request("'top_logprobs' is not supported.", param="top_logprobs", code="unsupported_parameter")
    _check_metadata(request.metadata)


def _check_item(item: InputItem, param: str) -> None:
    if isinstance(item, ItemReference):
        raise invalid_request(
            "Item references are not supported: send the item itself, or continue with 'previous_response_id'.",
            param=f"{param}.type",
            code="unsupported_parameter",
        )
    if isinstance(item, ReasoningItem) and item.encrypted_content and not item.content:
        raise invalid_request(
            "Encrypted reasoning cannot be read here: send reasoning 'content', or leave the item out.",
            param=f"{param}.encrypted_content",
            code="unsupported_parameter",
        )
    if isinstance(item, MessageItem | FunctionCallOutputItem):
        parts = item.content if isinstance(item, MessageItem) else item.output
        if isinstance(parts, list):
            field = "content" if isinstance(item, MessageItem) else "output"
            for j, part in enumerate(parts):
                user_image = isinstance(part, InputImage) and isinstance(item, MessageItem) and item.role == "user"
                if isinstance(part, InputFile) or (isinstance(part, InputImage) and not user_image):
                    kind = type(part).__struct_config__.tag
                    raise invalid_request(
                        f"Content parts of type '{kind}' are not supported: this model takes text only.",
                        param=f"{param}.{field}[{j}].type",
                        code="unsupported_parameter",
                    )


def decode_items(raw: Any, param: str) -> list[InputItem]:
    """Items a client sends outside `input` (a conversation's `items`), checked as input items are."""
    if not isinstance(raw, list):
        raise invalid_request(f"Invalid type for '{param}': expected an array of items.", param=param)
    raw = [
        {**item, "type": "message"} if isinstance(item, dict) and "type" not in item and "role" in item else item
        for item in raw
    ]
    try:
        items = msgspec.convert(raw, list[InputItem])
    except msgspec.ValidationError as exc:
        raise validation_error(str(exc).replace("$", param, 1)) from None
    except RecursionError:
        raise invalid_request("The JSON body of your request is nested too deeply.") from None
    for i, item in enumerate(items):
        _check_item(item, f"{param}[{i}]")
    return items


def check_metadata(metadata: Any) -> dict[str, str]:
    """`metadata` as OpenAI takes it (at most 16 string pairs, bounded lengths); {} for none."""
    if metadata is None:
        return {}
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise invalid_request("Invalid 'metadata': expected an object of string values.", param="metadata")
    _check_metadata(metadata)
    return metadata


def _check_metadata(metadata: dict[str, str] | None) -> None:
    """OpenAI's limits: at most 16 pairs, keys up to 64 characters, values up to 512."""
    if not metadata:
        return
    if len(metadata) > MAX_METADATA_PAIRS:
        raise invalid_request(
            f"Invalid 'metadata': at most {MAX_METADATA_PAIRS} key-value pairs are allowed, got {len(metadata)}.",
            param="metadata",
        )
    for key, value in metadata.items():
        if len(key) > 64:
            raise invalid_request(
                f"Invalid 'metadata': the key '{key[:64]}...' is longer than 64 characters.", "metadata"
            )
        if len(value) > 512:
            raise invalid_request(
                f"Invalid 'metadata': the value of '{key}' is longer than 512 characters.", "metadata"
            )
