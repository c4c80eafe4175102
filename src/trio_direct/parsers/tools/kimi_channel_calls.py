"""Kimi K3's XTML channels: `<|open|>NAME ATTRS<|sep|>` ... `<|close|>NAME<|sep|>` (kimi_k3).

The answer is a `response` channel, whose wrapper tags are dropped from content; calls live in a
`tools` channel:

    <|open|>tools<|sep|>
      <|open|>call tool="NAME" index="N"<|sep|>
        <|open|>argument key="KEY" type="TYPE"<|sep|>VALUE<|close|>argument<|sep|>
      <|close|>call<|sep|>
    <|close|>tools<|sep|>

Attribute values are escaped (`&quot;`, `&amp;`); argument values are raw text: `type="string"`
values stream as strings, others are JSON (kept as strings when they do not parse), as Kimi's
reference parser reads them. Spaces inside a tag (`<|open|> tools <|sep|>`) are tolerated.
"""

from __future__ import annotations

import re
from typing import Final

from trio_direct.parsers.tools.argument_tag_calls import XmlArgumentCalls
from trio_direct.parsers.tools.stream import MALFORMED, Malformed

__all__ = ["KimiK3Parser"]

_OPEN: Final = "<|open|>"
_CLOSE: Final = "<|close|>"
_SEP: Final = "<|sep|>"
_TAG: Final = re.compile(r'\s*(\w+)((?:\s+\w+\s*=\s*"[^"]*")*)\s*')
_ATTRIBUTE: Final = re.compile(r'(\w+)\s*=\s*"([^"]*)"')
_FRAMING: Final = frozenset({"response", "message"})  # channels whose tags are not content
_MAX_TAG: Final = 1024


def _unescape(value: str) -> str:
    return value.replace("&quot;", '"').replace("&amp;", "&")


class KimiK3Parser(XmlArgumentCalls):
    """Kimi K3 XTML tool calls; see the module docstring.

    Malformed: a `tools` channel whose content is not `call` blocks stays content; junk inside a
    call is skipped. Channels other than `response`, `message` and `tools` pass through as content.
    """

    format = "kimi_k3"
    MARKERS = (_OPEN, _CLOSE)
    _INFER_UNTYPED = True
    _ARGUMENT_END: Final = f"{_CLOSE}argument{_SEP}"

    def _on_marker(self, marker: str, at: int) -> None:
        self._begin_attempt(at, self._pos, markup=False)
        self._state = self._channel_open if marker == _OPEN else self._channel_close

    def _tag(self) -> tuple[str, dict[str, str]] | Malformed | None:
        """Read `NAME ATTRS<|sep|>` after an open or close token; `None` until it is complete."""
        buf, pos = self._buf, self._pos
        sep = buf.find(_SEP, pos)
        if sep < 0:
            tail = len(buf) - max((k for k in range(len(_SEP)) if buf.endswith(_SEP[:k])), default=0)
            if self._final or "<" in buf[pos:tail] or len(buf) - pos > _MAX_TAG:
                return MALFORMED
            return None
        found = _TAG.fullmatch(buf, pos, sep)
        if found is None:
            return MALFORMED
        self._pos = sep + len(_SEP)
        attributes = {k: _unescape(v) for k, v in _ATTRIBUTE.findall(found.group(2))}
        return found.group(1), attributes

    # Content: channel tags.

    def _channel_open(self) -> bool:
        tag = self._tag()
        if tag is None:
            return self._starved()
        if isinstance(tag, Malformed) or (tag[0] not in _FRAMING and tag[0] != "tools"):
            return self._fail()  # another channel (think, ...): its tags are content
        if tag[0] == "tools":
            self._markup_attempt = True  # from here a malformed section is worth reporting
            self._state = self._between
        else:
            self._mark = None  # framing: dropped
            self._state = self._content
        return True

    def _channel_close(self) -> bool:
        tag = self._tag()
        if tag is None:
            return self._starved()
        if isinstance(tag, Malformed) or tag[0] not in _FRAMING:
            return self._fail()
        self._mark = None
        self._state = self._content
        return True

    # The tools channel.

    def _between(self) -> bool:
        if not self._skip_ws():
            return self._starved()
        found = self._match(_OPEN, _CLOSE)
        if found is None:
            return self._starved()
        if not found:
            return self._fail() if self._mark is not None else self._to_content()
        if found == _OPEN and self._mark is None:
            self._begin_attempt(self._pos - len(found), self._pos)
        self._state = self._call_open if found == _OPEN else self._section_close
        return True

    def _to_content(self) -> bool:
        self._state = self._content
        return True

    def _section_close(self) -> bool:
        tag = self._tag()
        if tag is None:
            return self._starved()
        if isinstance(tag, Malformed) or tag[0] != "tools":
            return self._fail() if self._mark is not None else self._to_content()
        self._mark = None
        self._state = self._content
        return True

    def _call_open(self) -> bool:
        tag = self._tag()
        if tag is None:
            return self._starved()
        if isinstance(tag, Malformed) or tag[0] != "call":
            return self._fail()
        name = tag[1].get("tool", "").strip()
        if not self._valid_name(name):
            return self._fail()
        self._commit(name)
        self._state = self._body
        return True

    def _body(self) -> bool:
        if not self._skip_ws():
            return self._starved()
        found = self._match(_OPEN, _CLOSE)
        if found is None:
            return self._starved()
        if not found:
            self._skip_junk()
            return True
        self._state = self._argument_open if found == _OPEN else self._call_close
        return True

    def _argument_open(self) -> bool:
        tag = self._tag()
        if tag is None:
            return self._starved()
        if isinstance(tag, Malformed) or tag[0] != "argument" or "key" not in tag[1]:
            self._anomaly("skipped a tag that is not an argument")
            self._state = self._body
            return True
        self._key = tag[1]["key"]
        self._begin_value(("string",) if tag[1].get("type", "string") == "string" else ())
        self._state = self._value
        return True

    def _value(self) -> bool:
        hit = self._stream_value((self._ARGUMENT_END,), strip_newline=False)
        if hit is None:
            return self._starved()
        at, terminator = hit
        self._end_value(self._buf[self._pos : at])
        self._pos = at + len(terminator)
        self._state = self._body
        return True

    def _call_close(self) -> bool:
        tag = self._tag()
        if tag is None:
            return self._starved()
        if isinstance(tag, Malformed) or tag[0] not in ("call", "tools"):
            self._anomaly("skipped a closing tag that is not the call's")
            self._state = self._body
            return True
        self._end_call()
        self._state = self._between if tag[0] == "call" else self._content
        return True
