"""What a tool-call parser hands the frontend: OpenAI `tool_calls` deltas and finished calls."""

from __future__ import annotations

import random
import string
from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = ["ToolCall", "ToolCallDelta", "ToolDelta", "assemble", "new_call_id"]

_ALNUM = string.ascii_letters + string.digits


def new_call_id(rng: random.Random) -> str:
    """An OpenAI-style tool-call id: ``call_`` and 24 random letters and digits."""
    return "call_" + "".join(rng.choices(_ALNUM, k=24))


@dataclass(slots=True)
class ToolCallDelta:
    """One entry of a chunk's `delta.tool_calls`, in OpenAI streaming semantics.

    The first delta of a call carries its `id` and `name`; later ones carry `None` there.
    `arguments` is a piece of the JSON arguments string: all pieces of one `index`, joined in
    order, form the call's complete `function.arguments`.
    """

    index: int
    id: str | None
    name: str | None
    arguments: str


@dataclass(slots=True)
class ToolDelta:
    """Text to append to a choice's `content`, and tool-call deltas; either may be empty."""

    content: str = ""
    calls: list[ToolCallDelta] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.content or self.calls)


@dataclass(slots=True, frozen=True)
class ToolCall:
    """A finished call, as a unary response's `message.tool_calls[i]` shows it."""

    id: str
    name: str
    arguments_json: str


def assemble(deltas: Iterable[ToolDelta]) -> tuple[str, list[ToolCall]]:
    """Join a stream's deltas into the unary answer: `(content, calls in index order)`."""
    content: list[str] = []
    ids: dict[int, str] = {}
    names: dict[int, str] = {}
    arguments: dict[int, list[str]] = {}
    for delta in deltas:
        content.append(delta.content)
        for call in delta.calls:
            if call.id is not None:
                ids[call.index] = call.id
            if call.name is not None:
                names[call.index] = call.name
            arguments.setdefault(call.index, []).append(call.arguments)
    calls = [ToolCall(ids.get(i, ""), names.get(i, ""), "".join(arguments[i])) for i in sorted(arguments)]
    return "".join(content), calls
