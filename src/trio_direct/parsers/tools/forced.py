"""Tool calls the request forces (`tool_choice` "required" or a named function).

Then the engine is constrained by guided decoding (`openai.tool_choice`): the output is plain JSON
rather than the model's own tool markup. A named function's output is its arguments object,
streamed as the call's `arguments`; "required" gets a JSON array of `{"name", "parameters"}`,
parsed when it is complete. Both satisfy `ToolParser`, like the markup parsers; they read plain
JSON, so they need no special tokens kept.
"""

from __future__ import annotations

import json
import random

from trio_direct.parsers.tools.deltas import ToolCallDelta, ToolDelta, new_call_id


class NamedToolCallParser:
    """The whole output is the arguments of one call to `name`; they stream as they come."""

    requires_special_tokens = False

    def __init__(self, name: str, *, rng: random.Random | None = None) -> None:
        self.anomalies: list[str] = []
        self._name = name
        self._rng = rng if rng is not None else random.SystemRandom()
        self._opened = False
        self.call_count = 0

    def feed(self, text: str) -> ToolDelta:
        if not text:
            return ToolDelta()
        if not self._opened:
            self._opened = True
            self.call_count = 1
            return ToolDelta("", [ToolCallDelta(0, new_call_id(self._rng), self._name, text)])
        return ToolDelta("", [ToolCallDelta(0, None, None, text)])

    def finish(self) -> ToolDelta:
        if self._opened:
            return ToolDelta()
        self._opened = True
        self.call_count = 1  # a forced call with no output still is a call, with no arguments
        return ToolDelta("", [ToolCallDelta(0, new_call_id(self._rng), self._name, "{}")])


class RequiredToolCallsParser:
    """The output is a JSON array of calls; it is parsed once complete (it is not valid before)."""

    requires_special_tokens = False

    def __init__(self, *, rng: random.Random | None = None) -> None:
        self.anomalies: list[str] = []
        self._rng = rng if rng is not None else random.SystemRandom()
        self._text: list[str] = []
        self.call_count = 0

    def feed(self, text: str) -> ToolDelta:
        self._text.append(text)
        return ToolDelta()

    def finish(self) -> ToolDelta:
        text = "".join(self._text)
        try:
            calls = json.loads(text)
        except ValueError:
            self.anomalies.append("required: output is not JSON; kept as content")
            return ToolDelta(text)  # not what the constraint promised: give it back as content
        if not isinstance(calls, list) or not all(
            isinstance(c, dict) and isinstance(c.get("name"), str) for c in calls
        ):
            self.anomalies.append("required: output is not an array of calls; kept as content")
            return ToolDelta(text)
        deltas = [
            ToolCallDelta(i, new_call_id(self._rng), call["name"], json.dumps(call.get("parameters") or {}))
            for i, call in enumerate(calls)
        ]
        self.call_count = len(deltas)
        return ToolDelta("", deltas)
