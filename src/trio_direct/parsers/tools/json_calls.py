"""Calls as JSON objects `{"name": ..., "arguments": {...}}`: hermes, llama3_json, mistral, json,
cohere, inkling, granite.

The object is read key by key. The call commits as soon as its `"name"` string is complete
(llama3_json also waits for the arguments key), so the name streams first; the `"arguments"`
(or `"parameters"`) object then streams as raw text, exactly as the model wrote it. Arguments
written as a JSON *string* (`"arguments": "{...}"`) are decoded once complete; `null` or
missing arguments become `{}`. A key before `"name"` other than the arguments, `type` or `id`
means the object is not a call: the attempt rolls back and the text is content. Formats differ in
where the objects sit and in their key names (`tool_name`, `args`), which are class attributes.
"""

from __future__ import annotations

import json
import re
import string
from collections.abc import Callable
from typing import Any, ClassVar, Final

from trio_direct.parsers.tools.stream import (
    MALFORMED,
    Malformed,
    ToolCallParser,
    first_marker,
    partial_marker_length,
)
from trio_direct.parsers.tools.value_scan import BROKEN, JsonValueScanner

__all__ = [
    "CohereParser",
    "GraniteParser",
    "HermesParser",
    "InklingParser",
    "JsonObjectCalls",
    "JsonParser",
    "Llama3JsonParser",
    "LlamaNemotronParser",
    "MistralParser",
]

_NAME_CHARS: Final = re.compile(r"[\w.\-]*")
_CALL_ID_CHARS: Final = re.compile(r"[A-Za-z0-9_\-]*")
_MISTRAL_ID_CHARS: Final = string.ascii_letters + string.digits


class JsonObjectCalls(ToolCallParser):
    """Reads call objects and arrays of them; subclasses say where they sit in the text."""

    requires_special_tokens = True
    # Commit only once the arguments key is seen too: for formats whose calls are bare JSON,
    # where `{"name": "john", "age": 3}` is more likely an answer than a call.
    _NEEDS_ARGUMENTS_KEY: bool = False
    _NAME_KEYS: tuple[str, ...] = ("name",)
    _ARGUMENT_KEYS: tuple[str, ...] = ("arguments", "parameters")
    _EXTRA_KEYS: frozenset[str] = frozenset({"type", "id"})  # may come before the name

    def __init__(self, *args: Any, **kwargs: Any) -> None:
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
        if key in self._NAME_KEYS and not self._name_seen:
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
        if key in self._ARGUMENT_KEYS and not self._arguments_seen:
            self._arguments_seen = True
            if self._open is None and self._name_seen:
                self._open_call(self._name)  # the commit waited for the arguments key
            if self._open is not None and self._buf[self._pos] in "{[":
                self._stream_json_arguments(self._to_object_next)
                return True
            self._capture_value(self._arguments_captured)
            return True
        if self._open is None and key not in self._EXTRA_KEYS:
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
        if end in (BROKEN, start):
            return self._fail()
        self._capture.append(buf[start:end])
        self._pos = end
        raw, self._capture = "".join(self._capture), None
        self._captured(raw)
        return True

    # Calls as an array or one object, then another state: the shape of Cohere's action and
    # Granite's `<|tool_call|>` payload.

    def _calls_then(self, then: Callable[[], bool]) -> bool:
        """Read `[{...}, ...]` or one `{...}` of calls, then continue in state `then`."""
        if not self._skip_ws():
            return self._starved()
        char = self._buf[self._pos]
        if char == "[":
            self._read_array(lambda: self._continue_in(then))
        elif char == "{":
            self._read_object(lambda: self._close_then(then))
        else:
            return self._fail()
        return True

    def _continue_in(self, state: Callable[[], bool]) -> None:
        self._state = state

    def _close_then(self, state: Callable[[], bool]) -> None:
        self._close_call()
        self._state = state

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
    #: The closing tag; a format that is Hermes' JSON between other tags overrides it (and `MARKERS`).
    _END: ClassVar[str] = "</tool_call>"

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
    MARKERS: ClassVar[tuple[str, ...]] = ("<|python_tag|>",)
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

    def __init__(self, *args: Any, **kwargs: Any) -> None:
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


class JsonParser(Llama3JsonParser):
    """smg's `json`: the output opens (after spaces) with a call object `{"name": ...,
    "arguments": {...}}` or an array of them; `"parameters"` may stand for `"arguments"` and
    `"function"` for `"name"`.

    The call commits on its name, as smg's parser does. Malformed: output that does not open
    with a call object is content.
    """

    format = "json"
    MARKERS: ClassVar[tuple[str, ...]] = ()
    _NEEDS_ARGUMENTS_KEY = False
    _NAME_KEYS = ("name", "function")


class CohereParser(JsonObjectCalls):
    """Cohere Command R / A: `<|START_ACTION|>[{"tool_call_id": "0", "tool_name": ...,
    "parameters": {...}}, ...]<|END_ACTION|>` (a single object is accepted too).

    `name` may stand for `tool_name` and `arguments` for `parameters`. The response framing
    (`<|START_RESPONSE|>`, `<|END_RESPONSE|>`, `<|START_TEXT|>`, `<|END_TEXT|>`) is dropped from
    content. Malformed: an action block without a call stays content; junk after the calls is
    skipped to `<|END_ACTION|>`.
    """

    format = "cohere"
    _START: Final = "<|START_ACTION|>"
    _END: Final = "<|END_ACTION|>"
    MARKERS = (_START, "<|START_RESPONSE|>", "<|END_RESPONSE|>", "<|START_TEXT|>", "<|END_TEXT|>")
    _NAME_KEYS = ("tool_name", "name")
    _EXTRA_KEYS = frozenset({"type", "id", "tool_call_id"})

    def _on_marker(self, marker: str, at: int) -> None:
        if marker != self._START:
            return  # response framing: not content
        self._begin_attempt(at, self._pos)
        self._state = self._action

    def _action(self) -> bool:
        return self._calls_then(self._action_end)

    def _action_end(self) -> bool:
        if not self._skip_ws():
            return self._starved()
        found = self._match(self._END, self._START)
        if found is None:
            return self._starved()
        if not found:
            return self._fail()
        if found == self._START:
            self._on_marker(found, self._pos - len(found))
        else:
            self._state = self._content
        return True

    def _recover(self) -> bool:
        self._anomaly("malformed action block; skipped to its end")
        if self._open is not None:
            self._close_call()
        self._state = self._skip_to_end
        return True

    def _skip_to_end(self) -> bool:
        at = self._buf.find(self._END, self._pos)
        if at < 0:
            self._pos = max(self._pos, len(self._buf) - len(self._END) + 1)
            return self._starved()
        self._pos = at + len(self._END)
        self._state = self._content
        return True


class InklingParser(JsonObjectCalls):
    """Inkling (TML): `<|message_model|>NAME<|content_invoke_tool_json|>{"name": ..., "args":
    {...}}<|end_message|>`, typed blocks around the answer.

    Message headers (`<|message_model|>` up to the next control token) and the typed-block
    tokens are framing and dropped from content. A text-mode invocation
    (`<|content_invoke_tool_text|>`), which OpenAI tool calls cannot carry, stays content and is
    reported. Malformed: a JSON block that is not `{"name": ..., "args": ...}` stays content.
    """

    format = "inkling"
    _HEADER: Final = "<|message_model|>"
    _JSON_CALL: Final = "<|content_invoke_tool_json|>"
    _TEXT_CALL: Final = "<|content_invoke_tool_text|>"
    _ENDS: Final = ("<|end_message|>", "<|content_model_end_sampling|>")
    MARKERS = (_HEADER, _JSON_CALL, _TEXT_CALL, "<|content_text|>", "<|content_thinking|>", *_ENDS)
    _ARGUMENT_KEYS = ("args", "arguments")

    def _on_marker(self, marker: str, at: int) -> None:
        if marker == self._HEADER:
            self._state = self._header
        elif marker == self._JSON_CALL:
            self._begin_attempt(at, self._pos)
            self._read_object(self._to_block_end)
        elif marker == self._TEXT_CALL:
            self._anomaly("text-mode tool invocation kept as content")
            self._emit_content(marker)
        # Other typed-block tokens are framing: dropped.

    def _header(self) -> bool:
        hit = first_marker(self._buf, self._pos, self.MARKERS)
        if hit is None:
            if not self._final:  # drop the header so far, but not a control token's beginning
                self._pos = len(self._buf) - partial_marker_length(self._buf, self._pos, self.MARKERS)
                return False
            if self._pos < len(self._buf):
                self._anomaly(f"unfinished message header dropped: {self._buf[self._pos :]!r}")
            self._pos = len(self._buf)
            self._state = self._content
            return True
        at, marker = hit
        self._pos = at + len(marker)  # the header itself (author, tool name) is not content
        self._state = self._content
        self._on_marker(marker, at)
        return True

    def _to_block_end(self) -> None:
        self._close_call()
        self._state = self._block_end

    def _block_end(self) -> bool:
        if not self._skip_ws():
            return self._starved()
        if self._match(*self._ENDS) is None:
            return self._starved()
        self._state = self._content  # a missing end token is forgiven
        return True


class GraniteParser(JsonObjectCalls):
    """IBM Granite: `<|tool_call|>[{"name": ..., "arguments": {...}}, ...]` (3.0; 3.1 writes
    `<tool_call>`); the array may also open the output without the token, and a single object
    may stand for the array (an optional `</tool_call>` after it is markup).

    Malformed: a token not followed by call objects stays content.
    """

    format = "granite"
    MARKERS: ClassVar[tuple[str, ...]] = ("<|tool_call|>", "<tool_call>")
    _END: ClassVar[str] = "</tool_call>"

    def _start(self) -> bool:
        buf = self._buf
        first = self._pos
        while first < len(buf) and buf[first].isspace():
            first += 1
        if first == len(buf):
            if not self._final:
                return False
            self._state = self._content
            return True
        if buf[first] == "[":
            self._begin_attempt(self._pos, first + 1, markup=False)
            self._pos = first
            self._read_array(lambda: self._continue_in(self._after_calls))
        else:
            self._state = self._content
        return True

    def _on_marker(self, marker: str, at: int) -> None:
        self._begin_attempt(at, self._pos)
        self._state = self._after_marker

    def _after_marker(self) -> bool:
        return self._calls_then(self._after_calls)

    def _after_calls(self) -> bool:
        if not self._skip_ws():
            return self._starved()
        if self._match(self._END) is None:
            return self._starved()
        self._state = self._content
        return True


class LlamaNemotronParser(GraniteParser):
    """NVIDIA Llama-Nemotron (smg's `llama_nemotron` table): a JSON array of calls between
    `<TOOLCALL>` and `</TOOLCALL>`: `<TOOLCALL>[{"name": …, "arguments": {…}}]</TOOLCALL>`.

    Unlike Granite, calls are only read after the tag. Malformed: a tag not followed by call
    objects stays content.
    """

    format = "llama_nemotron"
    MARKERS = ("<TOOLCALL>",)
    _END = "</TOOLCALL>"

    def _start(self) -> bool:
        self._state = self._content
        return True
