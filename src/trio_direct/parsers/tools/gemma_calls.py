"""Gemma's `call:NAME{key:value,...}` tool calls: gemma4 and function_gemma.

Gemma 4 writes `<|tool_call>call:get_weather{location:<|"|>Paris<|"|>,days:3}<tool_call|>`;
FunctionGemma the same syntax in `<start_function_call>` ... `<end_function_call>` with `<escape>`
around strings. The value syntax is the chat templates' `format_argument`: strings between two
quote tokens with nothing escaped inside, `true` / `false`, numbers and `null` bare, objects as
`{key:value,...}` (keys bare, or quoted like strings), arrays as `[value,...]`; several calls are
concatenated. It is not JSON, so the arguments are rewritten as JSON while they arrive: `{` when
the call commits (at `call:NAME{`), each key with the start of its value, strings a piece at a
time (JSON-escaped), other scalars once their end is seen.

The value's syntax types it; the tool's schema (followed into nested objects and arrays) only
overrides a type it rules out: a bare `02139` for a `string` parameter stays the string
`"02139"`, a quoted `<|"|>3<|"|>` for an `integer` one becomes 3; bare text that is no literal is
a string. Malformed: a marker not followed by `call:NAME{` stays content; markup that goes wrong
after the commit ends the call as it stands (the JSON is closed) and is skipped to the call's end.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Final

from trio_direct.parsers.tools.schema_types import coerce_value, declared_types, item_schema, member_schema
from trio_direct.parsers.tools.stream import ToolCallParser, partial_marker_length

__all__ = ["FunctionGemmaParser", "GemmaCalls", "Gemma4Parser"]

_NAME_CHARS: Final = re.compile(r"[\w.\-]*")
_BARE_KEY: Final = re.compile(r"[^:,{}\[\]<]*")  # a key up to its `:`
_BARE_VALUE: Final = re.compile(r"[^,{}\[\]<]*")  # a bare scalar up to what ends it
_NUMBER: Final = re.compile(r"-?(?:0|[1-9]\d*)(\.\d+)?([eE][-+]?\d+)?")
_LITERALS: Final[Mapping[str, Any]] = {"true": True, "false": False, "null": None, "None": None}
_MAX_NAME: Final = 256
_MAX_KEY: Final = 1024


@dataclass(slots=True)
class _Container:
    """An object or array being written: its schema, and how many members it has so far."""

    is_object: bool
    schema: Mapping[str, Any] | None
    count: int = 0
    key: str = ""  # an object's member whose value comes next


class GemmaCalls(ToolCallParser):
    """The `call:NAME{...}` grammar; subclasses give the markers and the string quote."""

    requires_special_tokens = True
    CALL_END: ClassVar[str]
    QUOTE: ClassVar[str]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._stack: list[_Container] = []
        self._types: tuple[str, ...] = ()  # the value being read may be these types
        self._streaming = False  # the string being read goes out as it arrives
        self._held = ""  # a held string's text so far
        self._searched = 0  # chars after the cursor already searched for a bare value's end

    def _on_marker(self, marker: str, at: int) -> None:
        self._begin_attempt(at, self._pos)
        self._state = self._keyword

    # Before the commit: `call:NAME{`.

    def _keyword(self) -> bool:
        if not self._skip_ws():
            return self._starved()
        found = self._match("call:")
        if found is None:
            return self._starved()
        if not found:
            return self._fail()
        self._state = self._name
        return True

    def _name(self) -> bool:
        buf, pos = self._buf, self._pos
        end = _NAME_CHARS.match(buf, pos).end()  # type: ignore[union-attr]
        if end - pos > _MAX_NAME:
            return self._fail()
        if end == len(buf):
            return self._starved()
        name = buf[pos:end]
        if buf[end] != "{" or not self._valid_name(name):
            return self._fail()
        self._pos = end + 1
        self._open_call(name)
        self._emit_arguments("{")
        self._stack = [_Container(True, self._schemas.parameters(name))]
        self._state = self._member
        return True

    # Objects and arrays.

    def _member(self) -> bool:
        """In an object: a key, or the object's end (commas between members are skipped)."""
        if not self._skip_separators():
            return self._starved()
        buf, pos = self._buf, self._pos
        if buf[pos] == "}":
            self._pos += 1
            return self._close_container()
        ended = self._call_end_instead()
        if ended is not None:
            return ended
        quote = self._match(self.QUOTE)
        if quote is None:
            return self._starved()
        if quote:
            self._state = self._quoted_key
            return True
        end = _BARE_KEY.match(buf, pos).end()  # type: ignore[union-attr]
        if end - pos > _MAX_KEY:
            return self._fail()
        if end == len(buf):
            return self._starved()
        key = buf[pos:end].strip()
        if buf[end] != ":" or not key:
            return self._fail()
        self._pos = end + 1
        self._stack[-1].key = key
        self._state = self._value
        return True

    def _quoted_key(self) -> bool:
        buf, pos = self._buf, self._pos
        at = buf.find(self.QUOTE, pos)
        if at < 0:
            return self._fail() if len(buf) - pos > _MAX_KEY else self._starved()
        self._stack[-1].key = buf[pos:at]
        self._pos = at + len(self.QUOTE)
        self._state = self._colon
        return True

    def _colon(self) -> bool:
        if not self._skip_ws():
            return self._starved()
        if self._buf[self._pos] != ":":
            return self._fail()
        self._pos += 1
        self._state = self._value
        return True

    def _element(self) -> bool:
        """In an array: a value, or the array's end."""
        if not self._skip_separators():
            return self._starved()
        if self._buf[self._pos] == "]":
            self._pos += 1
            return self._close_container()
        ended = self._call_end_instead()
        if ended is not None:
            return ended
        self._state = self._value
        return True

    def _after_value(self) -> bool:
        if not self._skip_ws():
            return self._starved()
        char = self._buf[self._pos]
        inner = self._stack[-1]
        if char == ",":
            self._pos += 1
            self._state = self._member if inner.is_object else self._element
            return True
        if char == ("}" if inner.is_object else "]"):
            self._pos += 1
            return self._close_container()
        ended = self._call_end_instead()
        if ended is not None:
            return ended
        return self._fail()

    def _close_container(self) -> bool:
        inner = self._stack.pop()
        self._emit_arguments("}" if inner.is_object else "]")
        if self._stack:
            self._state = self._after_value
        else:
            self._close_call()
            self._state = self._call_end
        return True

    def _call_end_instead(self) -> bool | None:
        """The call's end marker where more arguments were expected (an unclosed `{`): the call
        ends there. `None` when the text is not that marker."""
        found = self._match(self.CALL_END)
        if found is None:
            return self._starved()
        if not found:
            return None
        self._anomaly(f"tool call {self._open.name if self._open else ''!r} ended with its arguments unclosed")
        self._close_call()
        self._state = self._content
        return True

    def _call_end(self) -> bool:
        if not self._skip_ws():
            return self._starved()
        found = self._match(self.CALL_END)
        if found is None:
            return self._starved()
        if not found:
            self._anomaly(f"text after a call's arguments instead of {self.CALL_END!r}; kept as content")
        self._state = self._content
        return True

    # Values.

    def _value(self) -> bool:
        if not self._skip_ws():
            return self._starved()
        buf, pos = self._buf, self._pos
        inner = self._stack[-1]
        quote = self._match(self.QUOTE)
        if quote is None:
            return self._starved()
        if inner.is_object:
            separator = ", " if inner.count else ""
            self._emit_arguments(f"{separator}{json.dumps(inner.key, ensure_ascii=False)}: ")
            schema = member_schema(inner.schema, inner.key)
        else:
            self._emit_arguments(", " if inner.count else "")
            schema = item_schema(inner.schema)
        inner.count += 1
        self._types = declared_types(schema) if schema is not None else ()
        if quote:
            self._streaming = not self._types or "string" in self._types
            self._held = ""
            if self._streaming:
                self._emit_arguments('"')
            self._state = self._string
        elif buf[pos] in "{[":
            self._pos += 1
            self._emit_arguments(buf[pos])
            self._stack.append(_Container(buf[pos] == "{", schema))
            self._state = self._member if buf[pos] == "{" else self._element
        else:
            self._searched = 0
            self._state = self._bare
        return True

    def _string(self) -> bool:
        buf, pos = self._buf, self._pos
        at = buf.find(self.QUOTE, pos)
        end = at if at >= 0 else len(buf) - partial_marker_length(buf, pos, (self.QUOTE,))
        self._string_piece(buf[pos:end])
        self._pos = end
        if at < 0:
            return self._starved()
        self._pos += len(self.QUOTE)
        self._end_string()
        self._state = self._after_value
        return True

    def _string_piece(self, text: str) -> None:
        if not text:
            return
        if self._streaming:
            self._emit_arguments(json.dumps(text, ensure_ascii=False)[1:-1])
        else:
            self._held += text

    def _end_string(self) -> None:
        if self._streaming:
            self._emit_arguments('"')
        else:
            value = coerce_value(self._held, self._types, infer=False)
            self._emit_arguments(json.dumps(value, ensure_ascii=False))
            self._held = ""
        self._types = ()

    def _bare(self) -> bool:
        buf, pos = self._buf, self._pos
        # The cursor waits at the value's start: search only what is new (linear, not quadratic).
        end = _BARE_VALUE.match(buf, pos + self._searched).end()  # type: ignore[union-attr]
        self._searched = end - pos
        if end == len(buf) and not self._final:
            return False
        raw = buf[pos:end].strip()
        if not raw:
            self._stack[-1].count -= 1  # nothing was written for it but its key
            return self._fail()
        self._pos = end
        self._emit_arguments(json.dumps(self._bare_value(raw), ensure_ascii=False))
        self._types = ()
        self._state = self._after_value
        return True

    def _bare_value(self, raw: str) -> Any:
        """A bare scalar: what its syntax says, unless the schema rules that type out."""
        value: Any
        if raw in _LITERALS:
            value = _LITERALS[raw]
        elif _NUMBER.fullmatch(raw):
            number = float(raw)
            value = int(raw) if re.fullmatch(r"-?\d+", raw) else number
            if not math.isfinite(number):
                value = raw
        else:
            value = raw
        types = self._types
        if not types or _json_type(value) in types or (_json_type(value) == "integer" and "number" in types):
            return value
        return coerce_value(raw, types, infer=False)

    # Endings.

    def _skip_separators(self) -> bool:
        """Consume whitespace and stray commas; True when something else is next."""
        buf, pos = self._buf, self._pos
        while pos < len(buf) and (buf[pos].isspace() or buf[pos] == ","):
            pos += 1
        self._pos = pos
        return pos < len(buf)

    def _starved(self) -> bool:
        if self._final and self._open is not None:
            if self._state == self._string:
                self._end_string()  # cut off inside a string: keep what arrived
            elif self._state == self._bare:
                return self._bare()
        return super()._starved()

    def _close_call(self) -> None:
        """End the call; a cut-off or abandoned one still gets valid JSON (its containers closed)."""
        while self._stack:
            self._emit_arguments("}" if self._stack.pop().is_object else "]")
        super()._close_call()

    def _recover(self) -> bool:
        self._anomaly("malformed tool call arguments; call ended there and skipped to its end")
        self._close_call()
        self._state = self._skip_to_call_end
        return True

    def _skip_to_call_end(self) -> bool:
        buf, pos = self._buf, self._pos
        at = buf.find(self.CALL_END, pos)
        if at < 0:
            self._pos = max(pos, len(buf) - len(self.CALL_END) + 1)
            return self._starved()
        self._pos = at + len(self.CALL_END)
        self._state = self._content
        return True


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    return "string"


class Gemma4Parser(GemmaCalls):
    """Gemma 4: `<|tool_call>call:NAME{key:<|"|>text<|"|>,n:3}<tool_call|>` (`<|"|>` quotes strings)."""

    format = "gemma4"
    MARKERS = ("<|tool_call>",)
    CALL_END = "<tool_call|>"
    QUOTE = '<|"|>'


class FunctionGemmaParser(GemmaCalls):
    """FunctionGemma: `<start_function_call>call:NAME{key:<escape>text<escape>}<end_function_call>`."""

    format = "function_gemma"
    MARKERS = ("<start_function_call>",)
    CALL_END = "<end_function_call>"
    QUOTE = "<escape>"
