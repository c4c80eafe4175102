"""`tool_choice` "required" and named functions, enforced with the engine's guided decoding.

As vLLM and SGLang do: a named function constrains the output to its `parameters` schema (the
output *is* the arguments); "required" constrains it to a non-empty JSON array of
``{"name": <one of the tools>, "parameters": <its schema>}``. "auto" and "none" constrain nothing.
"""

from __future__ import annotations

import json
from typing import Any

from trio_direct.core import errors
from trio_direct.openai.requests import ChatCompletionRequest, NamedToolChoice

_ANY_OBJECT: dict[str, Any] = {"type": "object"}


def forced_tool_name(request: ChatCompletionRequest) -> str | None:
    """The function a named `tool_choice` forces, else None."""
    choice = request.tool_choice
    return choice.function.name if isinstance(choice, NamedToolChoice) else None


def tool_choice_schema(request: ChatCompletionRequest) -> str | None:
    """The JSON schema (text) that enforces the request's `tool_choice`, or None."""
    if not request.tools or request.tool_choice in (None, "auto", "none"):
        return None
    if request.response_format is not None or request.regex is not None or request.ebnf is not None:
        raise errors.invalid_request(
            "A forced tool_choice cannot be combined with response_format, regex or ebnf.", param="tool_choice"
        )
    parameters = {tool.function.name: tool.function.parameters or _ANY_OBJECT for tool in request.tools}
    name = forced_tool_name(request)
    if name is not None:
        return json.dumps(parameters[name])
    calls = [
        {
            "type": "object",
            "properties": {"name": {"type": "string", "enum": [tool]}, "parameters": schema},
            "required": ["name", "parameters"],
        }
        for tool, schema in parameters.items()
    ]
    return json.dumps({"type": "array", "minItems": 1, "items": {"anyOf": calls}})
