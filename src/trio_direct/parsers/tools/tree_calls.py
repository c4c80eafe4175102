"""Calls whose arguments are a tree of XML elements named after the keys: minimax_m3.

MiniMax M3 writes `]<]minimax[>[<tool_call>\\n]<]minimax[>[<invoke name="NAME">]<]minimax[>[<city>
Paris]<]minimax[>[</city>]<]minimax[>[</invoke>\\n]<]minimax[>[</tool_call>`: the separator token
`]<]minimax[>[` before every tag, one `<invoke>` per call (a block may hold several, and there may
be several blocks), and each argument an element that holds either text or child elements (an
object, or an array's items under repeated names such as `<item>`). The `minimax_m3` reasoning
parser drops the separator from content, so the same tags without it are read too (the block's
first tag says which spelling the block uses).

Leaf text has XML entities decoded and is typed by the tool's schema, followed into nested objects
(`properties`) and arrays (`items`); untyped text is read as `true`/`false`/`null` (or Python's
spellings) or a number when it is one, else a string; an element with children is an object, or an
array where the schema says so, and repeated names collapse into an array; text beside children is
kept under `$text` (as smg's parser does). Each argument goes out whole once its element closes and
the next argument's name is known (a repeat of the name joins it). Malformed: a block without a
valid invoke stays content; markup that goes wrong inside a committed call ends the call with the
arguments read so far (the broken one is dropped, `anomalies` says so) and skips to `</invoke>`.
"""

from __future__ import annotations

import html
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from trio_direct.parsers.tools.schema_types import coerce_value, declared_types, item_schema, member_schema
from trio_direct.parsers.tools.stream import ToolCallParser, partial_marker_length

__all__ = ["MinimaxM3Parser"]

_SEPARATOR: Final = "]<]minimax[>["
_BLOCK: Final = "<tool_call>"
_ATTRIBUTES: Final = re.compile(r"""((?:\s+[\w\-]+\s*=\s*(?:"[^"]*"|'[^']*'))*)\s*>""")
_ATTRIBUTE: Final = re.compile(r"""([\w\-]+)\s*=\s*(?:"([^"]*)"|'([^']*)')""")
_TAG_NAME: Final = re.compile(r"[^<>\s/][^<>]{0,255}>")  # an element's name and its `>`
_TAG_NAME_PREFIX: Final = re.compile(r"[^<>\s/][^<>]{0,255}")
_MAX_TAG: Final = 1024
_ENTITIES: Final = {"&lt;": "<", "&gt;": ">", "&amp;": "&", "&quot;": '"', "&apos;": "'"}
_LITERALS: Final[Mapping[str, Any]] = {
    "true": True,
    "True": True,
    "false": False,
    "False": False,
    "null": None,
    "None": None,
}
_MIXED_TEXT: Final = "$text"


@dataclass(slots=True)
class _Element:
    name: str
    text: list[str] = field(default_factory=list)
    children: list[tuple[str, _Element]] = field(default_factory=list)


class MinimaxM3Parser(ToolCallParser):
    """MiniMax M3 (smg's `minimax_m3`): see the module docstring."""

    format = "minimax_m3"
    MARKERS = (_SEPARATOR, _BLOCK)
    requires_special_tokens = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._tag = ""  # what starts every tag in this block: `]<]minimax[>[<`, or `<`
        self._function = ""
        self._count = 0  # arguments written in this call
        self._object_open = False
        self._open_elements: list[_Element] = []  # the argument being read, outermost first
        self._pending: tuple[str, list[Any]] | None = None  # a finished argument, not yet written

    def _on_marker(self, marker: str, at: int) -> None:
        if marker == _SEPARATOR:
            # Only a block start if `<tool_call>` follows; otherwise the separator is plain text.
            self._begin_attempt(at, self._pos, markup=False)
            self._state = self._after_separator
        else:
            self._tag = "<"
            self._begin_attempt(at, self._pos)
            self._state = self._between

    def _after_separator(self) -> bool:
        found = self._match(_BLOCK)
        if found is None:
            return self._starved()
        if not found:
            return self._fail()
        self._tag = _SEPARATOR + "<"
        assert self._mark is not None
        self._begin_attempt(self._mark, self._pos)
        self._state = self._between
        return True

    # Between calls: the next invoke, or the block's end.

    def _between(self) -> bool:
        if not self._skip_ws():
            return self._starved()
        invoke, close = self._tag + "invoke", self._tag + "/tool_call>"
        found = self._match(invoke, close)
        if found is None:
            return self._starved()
        if found == invoke:
            if self._mark is None:
                self._begin_attempt(self._pos - len(found), self._pos)
            self._state = self._invoke
        elif self._mark is not None:
            return self._fail()  # the block holds no call: not this markup, it stays content
        elif found:
            self._state = self._content
        else:
            self._state = self._content  # text after an unclosed block
        return True

    def _invoke(self) -> bool:
        buf, pos = self._buf, self._pos
        found = _ATTRIBUTES.match(buf, pos)
        if found is None:
            if buf.find(">", pos) < 0 and "<" not in buf[pos:] and len(buf) - pos < _MAX_TAG and not self._final:
                return self._starved()
            return self._fail()
        attributes = {key: html.unescape(a or b) for key, a, b in _ATTRIBUTE.findall(found.group(1))}
        name = attributes.get("name", "").strip()
        if not self._valid_name(name):
            return self._fail()
        self._pos = found.end()
        self._open_call(name)
        self._function, self._count = name, 0
        self._emit_arguments("{")
        self._object_open = True
        self._state = self._body
        return True

    # Inside a call: top-level argument elements.

    def _body(self) -> bool:
        if not self._skip_ws():
            return self._starved()
        tag = self._tag
        found = self._match(tag + "/invoke>", tag + "/tool_call>", tag)
        if found is None:
            return self._starved()
        if found == tag + "/invoke>":
            self._close_call()
            self._state = self._between
        elif found == tag + "/tool_call>":
            self._anomaly(f"tool call {self._function!r} not closed before its block's end")
            self._close_call()
            self._state = self._content
        elif found:
            self._state = self._argument_open
        else:
            buf, pos = self._buf, self._pos
            at = buf.find(tag, pos)
            end = at if at >= 0 else len(buf) - partial_marker_length(buf, pos, (tag,))
            self._anomaly(f"skipped text between arguments: {buf[pos:end]!r}")
            self._pos = end
        return True

    def _argument_open(self) -> bool:
        name = self._element_name()
        if name is None:
            return self._starved()
        if not name:
            return self._fail()
        if self._pending is not None and self._pending[0] != name:
            self._write_pending()
        self._open_elements = [_Element(name)]
        self._state = self._element_body
        return True

    def _element_name(self) -> str | None:
        """Read `NAME>` at the cursor: the name, `""` if it is not one, `None` while it may grow."""
        buf, pos = self._buf, self._pos
        found = _TAG_NAME.match(buf, pos)
        if found is None:
            grows = _TAG_NAME_PREFIX.match(buf, pos)
            if not self._final and (pos == len(buf) or (grows is not None and grows.end() == len(buf))):
                return None
            return ""
        self._pos = found.end()
        return found.group()[:-1].strip()

    def _element_body(self) -> bool:
        """An element's text, up to the next tag (a child, or the element's end)."""
        buf, pos, tag = self._buf, self._pos, self._tag
        at = buf.find(tag, pos)
        end = at if at >= 0 else len(buf) - partial_marker_length(buf, pos, (tag,))
        if end > pos:
            self._open_elements[-1].text.append(buf[pos:end])
            self._pos = end
        if at < 0:
            return self._starved()
        self._pos += len(tag)
        self._state = self._element_tag
        return True

    def _element_tag(self) -> bool:
        element = self._open_elements[-1]
        if self._pos >= len(self._buf) and not self._final:
            return False
        if self._buf.startswith("/", self._pos):
            close = f"/{element.name}>"
            found = self._match(close)
            if found is None:
                return self._starved()
            if not found:
                return self._fail()  # another element's end: the tree is broken
            self._close_element()
            return True
        name = self._element_name()
        if name is None:
            return self._starved()
        if not name:  # not a tag: the text goes on
            element.text.append(self._tag)
        else:
            child = _Element(name)
            element.children.append((name, child))
            self._open_elements.append(child)
        self._state = self._element_body
        return True

    def _close_element(self) -> None:
        element = self._open_elements.pop()
        if self._open_elements:
            self._state = self._element_body
            return
        schema = member_schema(self._schemas.parameters(self._function), element.name)
        value = _to_json(element, schema)
        if self._pending is not None and self._pending[0] == element.name:
            self._pending[1].append(value)
        else:
            self._pending = (element.name, [value])
        self._state = self._body

    def _write_pending(self) -> None:
        if self._pending is None:
            return
        key, values = self._pending
        self._pending = None
        value = values[0] if len(values) == 1 else values
        separator = ", " if self._count else ""
        self._count += 1
        self._emit_arguments(
            f"{separator}{json.dumps(key, ensure_ascii=False)}: {json.dumps(value, ensure_ascii=False)}"
        )

    # Endings.

    def _starved(self) -> bool:
        if self._final and self._open is not None and self._open_elements:
            self._anomaly(f"argument {self._open_elements[0].name!r} cut off by the end of the stream")
            while self._open_elements:  # keep what arrived of the cut-off argument
                self._close_element()
        return super()._starved()

    def _close_call(self) -> None:
        if self._open_elements:
            self._anomaly(f"malformed argument {self._open_elements[0].name!r} dropped")
            self._open_elements = []
        self._write_pending()
        if self._object_open:
            self._emit_arguments("}")
            self._object_open = False
        super()._close_call()

    def _recover(self) -> bool:
        self._anomaly("malformed tool call; skipped to its end")
        self._close_call()
        self._state = self._skip_to_call_end
        return True

    def _skip_to_call_end(self) -> bool:
        buf, pos = self._buf, self._pos
        end = self._tag + "/invoke>"
        at = buf.find(end, pos)
        if at < 0:
            self._pos = max(pos, len(buf) - len(end) + 1)
            return self._starved()
        self._pos = at + len(end)
        self._state = self._between
        return True


def _to_json(element: _Element, schema: Mapping[str, Any] | None) -> Any:
    """An element's value: leaf text typed by `schema`, or its children as an object or array."""
    types = declared_types(schema) if schema is not None else ()
    text = "".join(element.text)
    if not element.children:
        return _leaf(_decode(text), types)
    children = list(element.children)
    if text.strip():
        key = _MIXED_TEXT
        while any(name == key for name, _ in children):
            key = "$" + key
        children.append((key, _Element(key, [text])))
    if "array" in types and "object" not in types:
        items = item_schema(schema)
        return [_to_json(child, items) for _, child in children]
    members: dict[str, Any] = {}
    repeated: set[str] = set()
    for name, child in children:
        value = _to_json(child, member_schema(schema, name))
        if name not in members:
            members[name] = value
        elif name in repeated:
            members[name].append(value)
        else:  # a repeated name: its values collapse into an array
            members[name] = [members[name], value]
            repeated.add(name)
    return members


def _leaf(text: str, types: tuple[str, ...]) -> Any:
    if not text.strip():
        if "array" in types:
            return []
        if "object" in types:
            return {}
    if types:
        return coerce_value(text, types, infer=False)
    if text in _LITERALS:
        return _LITERALS[text]
    if re.fullmatch(r"[-+]?\d+", text):
        return int(text)
    try:
        number = float(text)
    except ValueError:
        return text
    return number if math.isfinite(number) else text


def _decode(text: str) -> str:
    return re.sub(r"&(?:lt|gt|amp|quot|apos);", lambda m: _ENTITIES[m.group()], text)
