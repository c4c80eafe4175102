"""Calls as JSON objects `{"name": ..., "arguments": {...}}`: hermes, llama3_json, mistral.

The object is read key by key. The call commits as soon as its `"name"` string is complete
(llama3_json also waits for the arguments key), so the name streams first; the `"arguments"`
(or `"parameters"`) object then streams as raw text, exactly as the model wrote it. Arguments
written as a JSON *string* (`"arguments": "{...}"`) are decoded once complete; `null` or
missing arguments become `{}`. A key before `"name"` other than the arguments, `type` or `id`
means the object is not a call: the attempt rolls back and the text is content.
"""

from __future__ import annotations

import json
import re
import string
from collections.abc import Callable
from typing import Final

from trio_direct.parsers.tools.stream import MALFORMED, Malformed, ToolCallParser
from trio_direct.parsers.tools.value_scan import BROKEN, JsonValueScanner

__all__ = ["HermesParser", "JsonObjectCalls", "Llama3JsonParser", "MistralParser"]

_ARGUMENT_KEYS: Final = ("arguments", "parameters")
_EXTRA_KEYS: Final = frozenset({"type", "id"})
_NAME_CHARS: Final = re.compile(r"[\w.\-]*")
_CALL_ID_CHARS: Final = re.compile(r"[A-Za-z0-9_\-]*")
_MISTRAL_ID_CHARS: Final = string.ascii_letters + string.digits


class JsonObjectCalls(ToolCallParser):
    """Reads call objects and arrays of them; subclasses say where they sit in the text."""

    # Commit only once the arguments key is seen too: for formats whose calls are bare JSON,
    # where `{"name": "john", "age": 3}` is more likely an answer than a call.
    _NEEDS_ARGUMENTS_KEY: bool = False

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self._object_done: Callable[[], None] = self._no_op
        self._key = ""
        self._name = ""
        self._name_seen = False
        self._arguments_seen = False
        self._pending_arguments: str | None = None  # arguments that came before the name
        self._capture: list[str] | None = None
        self._array_done: Callable[[], None] = self._no_op
        self._array_items = 0

    # One object.

    def _read_object(self, done: Callable[[], None]) -> None:
        """Read the call object at the cursor; `done` runs once after its closing brace."""
        self._object_done = done
        self._name_seen = self._arguments_seen = False
        self._pending_arguments = None
        self._state = self._object_open

    def _object_open(self) -> bool:
        if not self._skip_ws():
            return self._starved()
        if self._buf[self._pos] != "{":
            return self._fail()
        self._pos += 1
        self._state = self._object_key
        return True

    def _object_key(self) -> bool:
        if not self._skip_ws():
            return self._starved()
        if self._buf[self._pos] == "}":
            self._pos += 1
            return self._object_end()
        key = self._json_string()
        if key is None:
            return self._starved()
        if isinstance(key, Malformed):
            return self._fail()
        self._key = key
        self._state = self._object_colon
        return True

    def _object_colon(self) -> bool:
        if not self._skip_ws():
            return self._starved()
        if self._buf[self._pos] != ":":
            return self._fail()
        self._pos += 1
        self._state = self._object_value
        return True

    def _object_value(self) -> bool:
        if not self._skip_ws():
            return self._starved()
        key = self._key
        if key == "name" and not self._name_seen:
            name = self._json_string()
            if name is None:
                return self._starved()
            if isinstance(name, Malformed) or not self._valid_name(name):
                return self._fail()
            self._name_seen, self._name = True, name
            if self._pending_arguments is not None or not self._NEEDS_ARGUMENTS_KEY:
                self._open_call(name)
                self._emit_arguments(self._pending_arguments or "")
            self._state = self._object_next
            return True
        if key in _ARGUMENT_KEYS and not self._arguments_seen:
            self._arguments_seen = True
            if self._open is None and self._name_seen:
                self._open_call(self._name)  # the commit waited for the arguments key
            if self._open is not None and self._buf[self._pos] in "{[":
                self._stream_json_arguments(self._to_object_next)
                return True
            self._capture_value(self._arguments_captured)
            return True
        if self._open is None and key not in _EXTRA_KEYS:
            return self._fail()  # some other JSON object, not a call
        self._capture_value(self._to_object_next_ignoring)
        return True

    def _to_object_next(self) -> None:
        self._state = self._object_next

    def _to_object_next_ignoring(self, _raw: str) -> None:
        self._state = self._object_next

    def _arguments_captured(self, raw: str) -> None:
        arguments = _arguments_text(raw)
        if isinstance(arguments, Malformed):
            self._fail()
            return
        if self._open is not None:
            self._emit_arguments(arguments)
        else:
            self._pending_arguments = arguments
        self._state = self._object_next

    def _object_next(self) -> bool:
        if not self._skip_ws():
            return self._starved()
        char = self._buf[self._pos]
        if char == ",":
            self._pos += 1
            self._state = self._object_key
            return True
        if char == "}":
            self._pos += 1
            return self._object_end()
        return self._fail()

    def _object_end(self) -> bool:
        if self._open is None:
            return self._fail()  # no name: not a call
        self._object_done()
        return True

    # A whole JSON value, held until complete.

    def _capture_value(self, done: Callable[[str], None]) -> None:
        self._captured = done
        self._capture = []
        self._scanner = JsonValueScanner()
        self._state = self._capture_more

    def _capture_more(self) -> bool:
        buf, start = self._buf, self._pos
        assert self._capture is not None
        end = self._scanner.scan(buf, start, self._final)
        if end is None:
            self._capture.append(buf[start:])
            self._pos = len(buf)
            return self._starved()
        if end == BROKEN or end == start:
            return self._fail()
        self._capture.append(buf[start:end])
        self._pos = end
        raw, self._capture = "".join(self._capture), None
        self._captured(raw)
        return True

    # An array of objects: `[{...}, {...}]`.

    def _read_array(self, done: Callable[[], None]) -> None:
        self._array_done = done
        self._array_items = 0
        self._state = self._array_open

    def _array_open(self) -> bool:
        if not self._skip_ws():
            return self._starved()
        if self._buf[self._pos] != "[":
            return self._fail()
        self._pos += 1
        self._state = self._array_item
        return True

    def _array_item(self) -> bool:
        if not self._skip_ws():
            return self._starved()
        char = self._buf[self._pos]
        if char == "]" and self._array_items:
            self._pos += 1
            self._array_done()
            return True
        if char != "{":
            return self._fail()
        if self._mark is None:
            self._begin_attempt(self._pos, self._pos + 1)
        self._read_object(self._array_item_done)
        return True

    def _array_item_done(self) -> None:
        self._close_call()
        self._array_items += 1
        self._state = self._array_next

    def _array_next(self) -> bool:
        if not self._skip_ws():
            return self._starved()
        char = self._buf[self._pos]
        if char == ",":
            self._pos += 1
            self._state = self._array_item
            return True
        if char == "]":
            self._pos += 1
            self._array_done()
            return True
        return self._fail()

    def _to_content(self) -> None:
        self._state = self._content

    def _close_then_content(self) -> None:
        self._close_call()
        self._state = self._content


class HermesParser(JsonObjectCalls):
    """Hermes / Qwen2.5 / Qwen3: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.

    Malformed: a `<tool_call>` whose object has no valid name stays content, markup included.
    After the name, junk up to `</tool_call>` is skipped (the call keeps what it had); a
    missing `</tool_call>` before the next `<tool_call>` is forgiven.
    """

    format = "hermes"
    MARKERS = ("<tool_call>",)
    _END: Final = "</tool_call>"

    def _on_marker(self, marker: str, at: int) -> None:
        self._begin_attempt(at, self._pos)
        self._read_object(self._to_end_tag)

    def _to_end_tag(self) -> None:
        self._state = self._end_tag

    def _end_tag(self) -> bool:
        if not self._skip_ws():
            return self._starved()
        found = self._match(self._END, self.MARKERS[0])
        if found is None:
            return self._starved()
        if not found:
            return self._fail()
        self._close_call()
        if found == self._END:
            self._state = self._content
        else:
            self._on_marker(found, self._pos - len(found))
        return True

    def _recover(self) -> bool:
        self._anomaly("malformed tool call; skipped to its end")
        self._state = self._skip_to_end
        return True

    def _skip_to_end(self) -> bool:
        buf, pos = self._buf, self._pos
        ends = [(at, m) for m in (self._END, self.MARKERS[0]) if (at := buf.find(m, pos)) >= 0]
        if not ends:
            self._pos = max(pos, len(buf) - len(self._END) + 1)
            return self._starved()
        at, marker = min(ends)
        self._pos = at + len(marker)
        self._close_call()
        if marker == self._END:
            self._state = self._content
        else:
            self._on_marker(marker, at)
        return True


class Llama3JsonParser(JsonObjectCalls):
    """Llama 3.x JSON calls: `{"name": ..., "parameters": {...}}`, several joined by `;`.

    Calls either follow `<|python_tag|>` anywhere or open the output bare (after spaces); a
    JSON array of call objects is accepted too. A call needs both `"name"` and `"parameters"`
    (or `"arguments"`). Malformed: JSON that is not such an object (a key other than `type` or
    `id` before both are seen) stays content; text after the calls is content.
    """

    format = "llama3_json"
    MARKERS = ("<|python_tag|>",)
    _NEEDS_ARGUMENTS_KEY = True

    def _start(self) -> bool:
        buf, pos = self._buf, self._pos
        first = pos
        while first < len(buf) and buf[first].isspace():
            first += 1
        if first == len(buf):
            if not self._final:
                return False
            self._state = self._content
            return True
        if buf[first] in "{[":
            self._begin_attempt(pos, first + 1, markup=False)
            self._pos = first
            self._read_calls()
        else:
            self._state = self._content
        return True

    def _on_marker(self, marker: str, at: int) -> None:
        self._begin_attempt(at, self._pos)
        self._state = self._after_tag

    def _after_tag(self) -> bool:
        if not self._skip_ws():
            return self._starved()
        if self._buf[self._pos] not in "{[":
            return self._fail()
        self._read_calls()
        return True

    def _read_calls(self) -> None:
        if self._buf[self._pos] == "[":
            self._read_array(self._to_content)
        else:
            self._read_object(self._call_done)

    def _call_done(self) -> None:
        self._close_call()
        self._state = self._after_call

    def _after_call(self) -> bool:
        if not self._skip_ws():
            return self._starved()
        char = self._buf[self._pos]
        if char == ";":
            self._pos += 1
            self._state = self._after_separator
        elif char == "{":
            self._next_object()
        else:
            self._state = self._content
        return True

    def _after_separator(self) -> bool:
        if not self._skip_ws():
            return self._starved()
        if self._buf[self._pos] == "{":
            self._next_object()
        else:
            self._state = self._content
        return True

    def _next_object(self) -> None:
        self._begin_attempt(self._pos, self._pos + 1)
        self._read_object(self._call_done)


class MistralParser(JsonObjectCalls):
    """Mistral: `[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]` (v0.3 and older), or
    `[TOOL_CALLS]name[ARGS]{...}` per call (newer tokenizers; `[CALL_ID]id` may precede
    `[ARGS]`).

    Ids are 9 alphanumerics, as Mistral chat templates require of `tool_call_id`; a model's
    `[CALL_ID]` is kept. Malformed: `[TOOL_CALLS]` not followed by a call stays content.
    """

    format = "mistral"
    MARKERS = ("[TOOL_CALLS]",)

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self._compact_name = ""
        self._compact_id: str | None = None

    def _new_id(self) -> str:
        return "".join(self._rng.choices(_MISTRAL_ID_CHARS, k=9))

    def _on_marker(self, marker: str, at: int) -> None:
        self._begin_attempt(at, self._pos)
        self._state = self._after_marker

    def _after_marker(self) -> bool:
        if not self._skip_ws():
            return self._starved()
        char = self._buf[self._pos]
        if char == "[":
            self._read_array(self._to_content)
        elif char == "{":
            self._read_object(self._close_then_content)
        else:
            self._state = self._compact_name_state
        return True

    def _compact_name_state(self) -> bool:
        buf, pos = self._buf, self._pos
        end = _NAME_CHARS.match(buf, pos).end()  # type: ignore[union-attr]
        if end == len(buf):
            return self._starved()
        name = buf[pos:end]
        if not self._valid_name(name):
            return self._fail()
        self._compact_name, self._compact_id = name, None
        self._pos = end
        self._state = self._compact_tag
        return True

    def _compact_tag(self) -> bool:
        found = self._match("[ARGS]", "[CALL_ID]")
        if found is None:
            return self._starved()
        if not found:
            return self._fail()
        if found == "[CALL_ID]":
            self._state = self._compact_call_id
            return True
        self._open_call(self._compact_name, self._compact_id)
        self._stream_json_arguments(self._close_then_content)
        return True

    def _compact_call_id(self) -> bool:
        buf, pos = self._buf, self._pos
        end = _CALL_ID_CHARS.match(buf, pos).end()  # type: ignore[union-attr]
        if end == len(buf):
            return self._starved()
        if end == pos:
            return self._fail()
        self._compact_id = buf[pos:end]
        self._pos = end
        self._state = self._compact_tag
        return True


def _arguments_text(raw: str) -> str | Malformed:
    """The arguments string for a captured (non-streamed) `"arguments"` value."""
    if raw.startswith('"'):
        try:
            decoded = json.loads(raw, strict=False)
        except ValueError:
            return MALFORMED
        return decoded if decoded.strip() else ""
    if raw == "null":
        return ""
    if raw[:1] in "{[":
        return raw
    return MALFORMED
