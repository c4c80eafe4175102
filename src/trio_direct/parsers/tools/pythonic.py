"""Calls written as a Python list of calls: `[get_weather(city="Paris"), f(x=[1, 2])]` (pythonic).

Llama 3.2 / 4 and several small models. The list must open the output (after spaces) or
follow `<|python_start|>`; a `[` later in prose is text. A call commits once its name is
followed by `(` and then `)` or `keyword=`, so `[Note(this is prose)]` stays text. Each
argument is a Python literal, converted to JSON when complete (`True` -> `true`); a value
that is not a literal is kept as its source text, a string.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable
from typing import Any, ClassVar, Final

from trio_direct.parsers.tools.stream import ToolCallParser
from trio_direct.parsers.tools.value_scan import PythonValueScanner

__all__ = ["Lfm25Parser", "Olmo3Parser", "PythonicParser", "SarashinaParser"]

_PYTHON_START: Final = "<|python_start|>"
_PYTHON_END: Final = "<|python_end|>"
# A call whose name and first argument are known: `name(` then `)` or `keyword=`.
_CALL_HEAD: Final = re.compile(r"([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)\s*\(\s*(?=\)|[A-Za-z_]\w*\s*=)")
# What `_CALL_HEAD` can still grow into.
_CALL_HEAD_PREFIX: Final = re.compile(r"[A-Za-z_][\w.]*(?:\s*(?:\(\s*(?:[A-Za-z_]\w*\s*)?)?)?")
_KEYWORD: Final = re.compile(r"([A-Za-z_]\w*)\s*=")
_KEYWORD_PREFIX: Final = re.compile(r"[A-Za-z_]\w*\s*")


class _PythonList(ToolCallParser):
    """Calls in a Python list, bare at the start of the output or after a marker: the shape the
    pythonic formats and Sarashina's share."""

    def _bare_list_then(self, then: Callable[[], bool]) -> bool:
        """At the start: a list opening the output (after whitespace) is an attempt at calls,
        continued in `then`; anything else is content."""
        buf, pos = self._buf, self._pos
        first = pos
        while first < len(buf) and buf[first].isspace():
            first += 1
        if first == len(buf):
            if not self._final:
                return False
            self._state = self._content
            return True
        if buf[first] == "[":
            self._begin_attempt(pos, first + 1, markup=False)
            self._pos = first + 1
            self._state = then
        else:
            self._state = self._content
        return True

    def _list_then(self, then: Callable[[], bool]) -> bool:
        """After a marker: the list's `[`, then state `then`."""
        if not self._skip_ws():
            return self._starved()
        if self._buf[self._pos] != "[":
            return self._fail()
        self._pos += 1
        self._state = then
        return True


class PythonicParser(_PythonList):
    """Pythonic tool calls; see the module docstring.

    Malformed: positional arguments, or anything but calls in the list, leave the list as
    content when seen before the first call commits; after that, the rest is content.
    """

    format = "pythonic"
    requires_special_tokens = True
    MARKERS: ClassVar[tuple[str, ...]] = (_PYTHON_START,)
    LIST_END: ClassVar[str] = _PYTHON_END  # optional markup after the list's `]`

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._count = 0
        self._object_open = False
        self._key = ""
        self._value_scanner = PythonValueScanner()
        self._value: list[str] = []

    def _start(self) -> bool:
        return self._bare_list_then(self._call_head)

    def _on_marker(self, marker: str, at: int) -> None:
        self._begin_attempt(at, self._pos)
        self._state = self._list_open

    def _list_open(self) -> bool:
        return self._list_then(self._call_head)

    def _call_head(self) -> bool:
        if not self._skip_ws():
            return self._starved()
        buf, pos = self._buf, self._pos
        head = _CALL_HEAD.match(buf, pos)
        if head is None:
            grows = _CALL_HEAD_PREFIX.match(buf, pos)
            if grows is not None and grows.end() == len(buf):
                return self._starved()
            return self._fail()
        self._pos = head.end()
        self._open_call(head.group(1))
        self._emit_arguments("{")
        self._object_open = True
        self._count = 0
        self._state = self._argument
        return True

    def _argument(self) -> bool:
        if not self._skip_ws():
            return self._starved()
        buf, pos = self._buf, self._pos
        if buf[pos] == ")":
            self._pos += 1
            self._end_call()
            return True
        keyword = _KEYWORD.match(buf, pos)
        if keyword is None:
            grows = _KEYWORD_PREFIX.match(buf, pos)
            if grows is not None and grows.end() == len(buf):
                return self._starved()
            return self._fail()
        self._key = keyword.group(1)
        self._pos = keyword.end()
        self._value_scanner = PythonValueScanner()
        self._value = []
        self._state = self._value_text
        return True

    def _value_text(self) -> bool:
        buf, start = self._buf, self._pos
        end = self._value_scanner.scan(buf, start)
        if end is None:
            self._value.append(buf[start:])
            self._pos = len(buf)
            return self._starved()
        self._value.append(buf[start:end])
        self._pos = end
        source = "".join(self._value).strip()
        separator = ", " if self._count else ""
        self._count += 1
        self._emit_arguments(f"{separator}{json.dumps(self._key)}: {self._to_json(source)}")
        self._state = self._argument_end
        return True

    def _argument_end(self) -> bool:
        if not self._skip_ws():
            return self._starved()
        char = self._buf[self._pos]
        if char not in ",)":
            return self._fail()
        self._pos += 1
        if char == ")":
            self._end_call()
        else:
            self._state = self._argument
        return True

    def _end_call(self) -> None:
        self._close_call()
        self._state = self._after_call

    def _after_call(self) -> bool:
        if not self._skip_ws():
            return self._starved()
        char = self._buf[self._pos]
        if char == ",":
            self._pos += 1
            self._state = self._next_call
        elif char == "]":
            self._pos += 1
            self._state = self._list_end
        else:
            self._state = self._content
        return True

    def _next_call(self) -> bool:
        if not self._skip_ws():
            return self._starved()
        self._begin_attempt(self._pos, self._pos + 1)
        self._state = self._call_head
        return True

    def _list_end(self) -> bool:
        if not self._skip_ws():
            return self._starved()
        if self._match(self.LIST_END) is None:
            return self._starved()
        self._state = self._content
        return True

    def _close_call(self) -> None:
        if self._object_open:  # also when cut off: the arguments stay an object
            self._emit_arguments("}")
            self._object_open = False
        super()._close_call()

    def _to_json(self, source: str) -> str:
        try:
            value: Any = ast.literal_eval(source)
            return json.dumps(value, ensure_ascii=False, allow_nan=False)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            self._anomaly(f"argument {self._key!r} is not a Python literal; kept as text")
            return json.dumps(source, ensure_ascii=False)


class Lfm25Parser(PythonicParser):
    """LiquidAI LFM2.5: the pythonic list between `<|tool_call_start|>` and `<|tool_call_end|>`
    (smg's `lfm2.5` table): `<|tool_call_start|>[get_weather(city='Paris')]<|tool_call_end|>`."""

    format = "lfm2_5"
    MARKERS = ("<|tool_call_start|>",)
    LIST_END = "<|tool_call_end|>"


class Olmo3Parser(PythonicParser):
    """AllenAI Olmo 3 (smg's `olmo3` table): the turn's calls between `<function_calls>` and
    `</function_calls>`, one Python call per line and no list brackets:
    `<function_calls>\\nget_weather(city="Paris")\\nget_time(zone="CET")\\n</function_calls>`.

    Malformed: a block whose first line is not a call stays content; after a committed call,
    text that is neither a call nor the block's end is content.
    """

    format = "olmo3"
    MARKERS = ("<function_calls>",)
    LIST_END = "</function_calls>"

    def _start(self) -> bool:
        self._state = self._content  # calls only inside the block
        return True

    def _list_open(self) -> bool:
        self._state = self._call_head
        return True

    def _after_call(self) -> bool:
        if not self._skip_ws():
            return self._starved()
        found = self._match(self.LIST_END)
        if found is None:
            return self._starved()
        if found:
            self._state = self._content
            return True
        self._state = self._next_line
        return True

    def _next_line(self) -> bool:
        buf, pos = self._buf, self._pos
        head = _CALL_HEAD.match(buf, pos)
        if head is None:
            grows = _CALL_HEAD_PREFIX.match(buf, pos)
            if grows is not None and grows.end() == len(buf) and not self._final:
                return False
            self._state = self._content  # prose after the calls: content
            return True
        self._begin_attempt(pos, pos)
        self._state = self._call_head
        return True


class SarashinaParser(_PythonList):
    """SoftBank Sarashina: a Python list of call dicts, `[{'name': 'get_weather', 'arguments':
    {'city': 'Tokyo'}}]`, after `<|tool_calls|>` or opening the output (the token is special and
    often detokenized away).

    Each dict is read whole, then converted (`True` -> `true`): a call goes out when its dict is
    complete. Malformed: a dict without a string `name` (or with arguments that are not a dict)
    stays content, from that dict on.
    """

    format = "sarashina"
    requires_special_tokens = True
    MARKERS = ("<|tool_calls|>",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._dict_scanner = PythonValueScanner()
        self._source: list[str] = []

    def _start(self) -> bool:
        return self._bare_list_then(self._element)

    def _on_marker(self, marker: str, at: int) -> None:
        self._begin_attempt(at, self._pos)
        self._state = self._list_open

    def _list_open(self) -> bool:
        return self._list_then(self._element)

    def _element(self) -> bool:
        if not self._skip_ws():
            return self._starved()
        if self._buf[self._pos] != "{":
            return self._fail()
        if self._mark is None:
            self._begin_attempt(self._pos, self._pos + 1)
        self._dict_scanner = PythonValueScanner()
        self._source = []
        self._state = self._element_text
        return True

    def _element_text(self) -> bool:
        buf, start = self._buf, self._pos
        end = self._dict_scanner.scan(buf, start)
        if end is None:
            self._source.append(buf[start:])
            self._pos = len(buf)
            return self._starved()
        self._source.append(buf[start:end])
        call = _call_from_dict("".join(self._source))
        if call is None:
            return self._fail()
        self._pos = end
        self._open_call(call[0])
        self._emit_arguments(call[1])
        self._close_call()
        self._state = self._after_element
        return True

    def _after_element(self) -> bool:
        if not self._skip_ws():
            return self._starved()
        char = self._buf[self._pos]
        self._pos += 1
        self._state = self._element if char == "," else self._content
        if char not in ",]":
            self._pos -= 1
        return True


def _call_from_dict(source: str) -> tuple[str, str] | None:
    """`(name, arguments JSON)` for a Python dict literal that is a call, else None."""
    try:
        value = ast.literal_eval(source.strip())
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments")
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict) or not ToolCallParser._valid_name(value["name"]):
        return None
    try:
        return value["name"], json.dumps(arguments, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError):
        return None
