"""The request every conversational surface plans: `ConversationRequest`, and what chat, Responses
and Messages share in building one.

A conversation is planned the same way whichever API it came in by (`surfaces.chat.plan_conversation`):
the chat template over OpenAI-style messages and tools, the tokenizer, stop strings, guided
decoding, forced tool choices, the reasoning and tool-call parsers and every sampling rule are
chat's, never a copy. Each surface converts its own typed request (a `msgspec.Struct` decoded from
the body) straight into a `ConversationRequest`: its messages are already the dicts the template
consumes, its sampling the engine's `SamplingOptions`. Nothing is written as a chat body and decoded
again. The Responses and Messages requests are held to chat's rules for the fields they share with
it (`check_as_chat`), so a value chat refuses is refused there too, with chat's words.

The messages are built with the keys in the order chat's decoder gives them (`ChatMessage`'s
fields, then a tool call's `id`, `function`, `type`): a template that prints a message or a call
whole (`tojson`) writes the same prompt whichever surface it came from.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from trio_direct.engine.types import SamplingOptions
from trio_direct.openai.requests import (
    SamplingExtras,
    check_constraints,
    check_min_tokens,
    check_sampling,
    check_tool_choice,
)
from trio_direct.surfaces.output_blocks import OutputBlock

__all__ = [
    "ConversationRequest",
    "assistant_message",
    "chat_tool",
    "chat_tool_call",
    "check_as_chat",
    "stored_messages",
    "template_message",
]


@dataclass(slots=True, kw_only=True)
class ConversationRequest:
    """What a conversational request asks for, in the terms chat's planner takes."""

    #: The conversation as the chat template takes it: OpenAI-style message dicts.
    messages: list[dict[str, Any]]
    #: Function tools as the template takes them (`{"type": "function", "function": {...}}`).
    tools: list[dict[str, Any]] | None = None
    #: "none" (tools are shown but not parsed), "auto", "required" (at least one call, by guided
    #: decoding), or None (not given: as "auto").
    tool_choice: Literal["none", "auto", "required"] | None = None
    #: The function a named tool choice forces (the output is its arguments, by guided decoding).
    forced_tool: str | None = None
    #: The client constrained the output itself (an output format, even "text", a regex or an ebnf
    #: grammar): a forced tool choice, a constraint too, is refused with it.
    constrained: bool = False
    #: The last (assistant) message is continued rather than a new turn opened.
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    #: The effort a gpt-oss (harmony) prompt is written with.
    reasoning_effort: str | None = None
    #: Reasoning split out by the model's reasoning parser (else left in the text).
    separate_reasoning: bool = True
    #: Engine sampling as the engine gets it (the tokenizer's EOS ids among the stop token ids
    #: unless EOS is ignored), but for the schema a forced tool choice adds at planning.
    sampling: SamplingOptions = field(default_factory=SamplingOptions)
    #: A matched stop string is kept at the end of the text.
    include_stop_str: bool = False
    n: int = 1
    stream: bool = False
    include_usage: bool = False
    return_logprob: bool = False
    top_logprobs: int = 0


def check_as_chat(
    extras: SamplingExtras,
    *,
    temperature: float | None = None,
    top_p: float | None = None,
    stop: str | list[str] | None = None,
    max_tokens: int | None = None,
    json_format: bool = False,
    regex: str | None = None,
    ebnf: str | None = None,
    tool_choice: str | None = None,
    forced_tool: str | None = None,
    tools: Iterable[str] = (),
) -> None:
    """Chat's rules for the fields a surface shares with chat, in chat's order and words: the
    sampling ranges, one structured-output constraint, `min_tokens` within the budget, a tool
    choice that names an offered tool."""
    check_sampling(extras, temperature=temperature, top_p=top_p, stop=stop)
    check_constraints(json_format, regex, ebnf)
    check_min_tokens(extras.min_tokens, max_tokens)
    check_tool_choice(tool_choice, forced_tool, list(tools))


def template_message(
    role: str,
    content: Any = None,
    *,
    tool_calls: list[dict[str, Any]] | None = None,
    tool_call_id: str | None = None,
    reasoning_content: str | None = None,
) -> dict[str, Any]:
    """One message as the template takes it: the fields given (None: absent), in chat's order."""
    message: dict[str, Any] = {"role": role}
    if content is not None:
        message["content"] = content
    if tool_calls is not None:
        message["tool_calls"] = tool_calls
    if tool_call_id is not None:
        message["tool_call_id"] = tool_call_id
    if reasoning_content is not None:
        message["reasoning_content"] = reasoning_content
    return message


def stored_messages(messages: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Messages read back from the state store as the template takes them. A store may hold what
    an earlier version wrote, with its keys in another order: they are put in chat's."""
    out = []
    for message in messages:
        ordered = {key: message[key] for key in _MESSAGE_KEYS if message.get(key) is not None}
        calls = ordered.get("tool_calls")
        if calls is not None:
            ordered["tool_calls"] = [
                chat_tool_call(call["id"], call["function"]["name"], call["function"]["arguments"]) for call in calls
            ]
        out.append(ordered)
    return out


#: A chat message's fields, in the order chat's decoder writes them.
_MESSAGE_KEYS = ("role", "content", "name", "tool_calls", "tool_call_id", "reasoning_content")


def chat_tool(
    name: str, description: str | None, parameters: dict[str, Any] | None, strict: bool | None = None
) -> dict[str, Any]:
    function: dict[str, Any] = {"name": name}
    if description is not None:
        function["description"] = description
    if parameters is not None:
        function["parameters"] = parameters
    if strict is not None:
        function["strict"] = strict
    return {"type": "function", "function": function}


def chat_tool_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "function": {"name": name, "arguments": arguments}, "type": "function"}


def assistant_message(blocks: list[OutputBlock]) -> dict[str, Any]:
    """A turn's output blocks as the chat assistant message that continues the conversation."""
    reasoning = "".join(block.text for block in blocks if block.kind == "reasoning")
    text = "".join(block.text for block in blocks if block.kind == "text")
    calls = [chat_tool_call(b.call_id, b.name, b.text or "{}") for b in blocks if b.kind == "tool_call"]
    return template_message(
        "assistant",
        text if text or not calls else None,
        tool_calls=calls or None,
        reasoning_content=reasoning or None,
    )
