"""`tool_choice` "required" and named functions, enforced with the engine's guided decoding.

As vLLM and SGLang do: a named function constrains the output to its `parameters` schema (the
output *is* the arguments); "required" constrains it to a non-empty JSON array of
``{"name": <one of the tools>, "parameters": <its schema>}``. "auto" and "none" constrain nothing.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from trio_direct.core import errors
from trio_direct.openai.requests import ChatCompletionRequest, NamedToolChoice

_ANY_OBJECT: dict[str, Any] = {"type": "object"}


def forced_tool_name(request: ChatCompletionRequest) -> str | None:
    """The function a named `tool_choice` forces, else None."""
    choice = request.tool_choice
    return choice.function.name if isinstance(choice, NamedToolChoice) else None


def tool_choice_schema(request: ChatCompletionRequest) -> str | None:
    """The JSON schema (text) that enforces the request's `tool_choice`, or None."""
    choice = request.tool_choice
    return forced_tools_schema(
        msgspec.to_builtins(request.tools) if request.tools else None,
        required=choice == "required",
        forced=forced_tool_name(request),
        constrained=request.response_format is not None or request.regex is not None or request.ebnf is not None,
    )


def forced_tools_schema(
    tools: Sequence[Mapping[str, Any]] | None, *, required: bool, forced: str | None, constrained: bool
) -> str | None:
    """The JSON schema (text) that enforces a tool choice over `tools` (chat's tool objects):
    `forced` names the one function to call, `required` asks for at least one call. A forced
    choice is itself a constraint: one on output the client `constrained` already is refused."""
    if not tools or (forced is None and not required):
        return None
    if constrained:
        raise errors.invalid_request(
            "A forced tool_choice cannot be combined with response_format, regex or ebnf.", param="tool_choice"
        )
    parameters = {tool["function"]["name"]: tool["function"].get("parameters") or _ANY_OBJECT for tool in tools}
    if forced is not None:
        return json.dumps(parameters[forced])
    calls = [
        {
            "type": "object",
            "properties": {"name": {"type": "string", "enum": [tool]}, "parameters": schema},
            "required": ["name", "parameters"],
        }
        for tool, schema in parameters.items()
    ]
    return json.dumps({"type": "array", "minItems": 1, "items": {"anyOf": calls}})
