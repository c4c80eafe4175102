"""Calls framed by special tokens around JSON arguments: deepseek_v3, deepseek_v31, kimi_k2.

All three wrap calls in a section (`<｜tool▁calls▁begin｜>` ... `<｜tool▁calls▁end｜>`), each call
between its own begin and end tokens; only the header before the JSON differs. A bare call
begin without the section begin is accepted too. The detokenizer must keep special tokens
for these formats, or there is no markup to see.
"""

from __future__ import annotations

import re
from typing import ClassVar, Final

from trio_direct.parsers.tools.stream import MALFORMED, Malformed, ToolCallParser

__all__ = ["DeepSeekV3Parser", "DeepSeekV31Parser", "KimiK2Parser", "SectionCalls"]

# DeepSeek's tokens use FULLWIDTH VERTICAL LINE (U+FF5C) and LOWER ONE EIGHTH BLOCK (U+2581).
_DS_CALLS_BEGIN: Final = "<\uff5ctool\u2581calls\u2581begin\uff5c>"
_DS_CALLS_END: Final = "<\uff5ctool\u2581calls\u2581end\uff5c>"
_DS_CALL_BEGIN: Final = "<\uff5ctool\u2581call\u2581begin\uff5c>"
_DS_CALL_END: Final = "<\uff5ctool\u2581call\u2581end\uff5c>"
_DS_SEP: Final = "<\uff5ctool\u2581sep\uff5c>"

_WORD: Final = re.compile(r"\w*")
_NAME_CHARS: Final = re.compile(r"[\w.\-]*")
_KIMI_ID_CHARS: Final = re.compile(r"[\w.\-:]*")
_KIMI_ID: Final = re.compile(r"(?:functions\.)?([\w.\-]+):\d+")
_SPACES: Final = re.compile(r"\s*")


class SectionCalls(ToolCallParser):
    """Section and call tokens around each call; subclasses read the header and commit."""

    requires_special_tokens = True

    SECTION_BEGIN: ClassVar[tuple[str, ...]]
    SECTION_END: ClassVar[tuple[str, ...]]
    CALL_BEGIN: ClassVar[str]
    CALL_END: ClassVar[str]

    def _on_marker(self, marker: str, at: int) -> None:
        self._begin_attempt(at, self._pos)
        self._state = self._header if marker == self.CALL_BEGIN else self._section_open

    def _section_open(self) -> bool:
        if not self._skip_ws():
            return self._starved()
        found = self._match(self.CALL_BEGIN)
        if found is None:
            return self._starved()
        if not found:
            return self._fail()
        self._state = self._header
        return True

    def _header(self) -> bool:
        raise NotImplementedError

    def _to_call_end(self) -> None:
        self._state = self._call_end

    def _call_end(self) -> bool:
        if not self._skip_ws():
            return self._starved()
        found = self._match(self.CALL_END)
        if found is None:
            return self._starved()
        if not found:
            return self._fail()
        self._close_call()
        self._state = self._between
        return True

    def _between(self) -> bool:
        if not self._skip_ws():
            return self._starved()
        found = self._match(self.CALL_BEGIN, *self.SECTION_END)
        if found is None:
            return self._starved()
        if found == self.CALL_BEGIN:
            self._begin_attempt(self._pos - len(found), self._pos)
            self._state = self._header
        else:  # the section's end, or text after an unclosed section: content
            self._state = self._content
        return True

    def _recover(self) -> bool:
        self._anomaly("malformed tool call; skipped to its end")
        self._state = self._skip_to_end
        return True

    def _skip_to_end(self) -> bool:
        buf, pos = self._buf, self._pos
        at = buf.find(self.CALL_END, pos)
        if at < 0:
            self._pos = max(pos, len(buf) - len(self.CALL_END) + 1)
            return self._starved()
        self._pos = at + len(self.CALL_END)
        self._close_call()
        self._state = self._between
        return True

    def _read_until(self, chars: re.Pattern[str], literal: str) -> str | Malformed | None:
        """Read `chars`, optional spaces, then `literal`; return the characters read."""
        buf, pos = self._buf, self._pos
        end = chars.match(buf, pos).end()  # type: ignore[union-attr]
        after = _SPACES.match(buf, end).end()  # type: ignore[union-attr]
        if after == len(buf):
            return MALFORMED if self._final else None
        if buf.startswith(literal, after):
            self._pos = after + len(literal)
            return buf[pos:end]
        if not self._final and literal.startswith(buf[after:]):
            return None
        return MALFORMED


class DeepSeekV3Parser(SectionCalls):
    """DeepSeek V3 / R1: `<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\n{...}\\n```
    <｜tool▁call▁end｜>` inside `<｜tool▁calls▁begin｜>` ... `<｜tool▁calls▁end｜>`.

    The code fence is optional. Malformed: a header that does not name a function leaves the
    markup in content; junk after the arguments is skipped to `<｜tool▁call▁end｜>`.
    """

    format = "deepseek_v3"
    SECTION_BEGIN = (_DS_CALLS_BEGIN,)
    SECTION_END = (_DS_CALLS_END,)
    CALL_BEGIN = _DS_CALL_BEGIN
    CALL_END = _DS_CALL_END
    MARKERS = (_DS_CALLS_BEGIN, _DS_CALL_BEGIN)

    def _header(self) -> bool:
        kind = self._read_until(_WORD, _DS_SEP)  # "function"
        if kind is None:
            return self._starved()
        if isinstance(kind, Malformed):
            return self._fail()
        self._state = self._name_line
        return True

    def _name_line(self) -> bool:
        buf, pos = self._buf, self._pos
        end = _NAME_CHARS.match(buf, pos).end()  # type: ignore[union-attr]
        if end == len(buf):
            return self._starved()
        name = buf[pos:end]
        if buf[end] != "\n" or not self._valid_name(name):
            return self._fail()
        self._pos = end + 1
        self._open_call(name)
        self._state = self._fence_open
        return True

    def _fence_open(self) -> bool:
        if not self._skip_ws():
            return self._starved()
        if self._match("```json", "```") is None:
            return self._starved()
        self._stream_json_arguments(self._to_fence_close)
        return True

    def _to_fence_close(self) -> None:
        self._state = self._fence_close

    def _fence_close(self) -> bool:
        if not self._skip_ws():
            return self._starved()
        if self._match("```") is None:
            return self._starved()
        self._state = self._call_end
        return True


class DeepSeekV31Parser(SectionCalls):
    """DeepSeek V3.1: `<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>` inside the
    same section tokens as V3.

    Malformed: a name that is not a function name leaves the markup in content; junk after the
    arguments is skipped to `<｜tool▁call▁end｜>`.
    """

    format = "deepseek_v31"
    SECTION_BEGIN = (_DS_CALLS_BEGIN,)
    SECTION_END = (_DS_CALLS_END,)
    CALL_BEGIN = _DS_CALL_BEGIN
    CALL_END = _DS_CALL_END
    MARKERS = (_DS_CALLS_BEGIN, _DS_CALL_BEGIN)

    def _header(self) -> bool:
        if not self._skip_ws():
            return self._starved()
        name = self._read_until(_NAME_CHARS, _DS_SEP)
        if name is None:
            return self._starved()
        if isinstance(name, Malformed) or not self._valid_name(name):
            return self._fail()
        self._open_call(name)
        self._stream_json_arguments(self._to_call_end)
        return True


class KimiK2Parser(SectionCalls):
    """Kimi K2: `<|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{...}
    <|tool_call_end|>` inside `<|tool_calls_section_begin|>` ... `<|tool_calls_section_end|>`.

    The model's own `functions.NAME:IDX` is the call id: Kimi's chat template writes it back
    into the next prompt. The singular `tool_call_section` spelling is accepted too.
    Malformed: an id that is not `[functions.]NAME:IDX` leaves the markup in content.
    """

    format = "kimi_k2"
    SECTION_BEGIN = ("<|tool_calls_section_begin|>", "<|tool_call_section_begin|>")
    SECTION_END = ("<|tool_calls_section_end|>", "<|tool_call_section_end|>")
    CALL_BEGIN = "<|tool_call_begin|>"
    CALL_END = "<|tool_call_end|>"
    MARKERS = (*SECTION_BEGIN, CALL_BEGIN)
    _ARGUMENT_BEGIN: Final = "<|tool_call_argument_begin|>"

    def _header(self) -> bool:
        if not self._skip_ws():
            return self._starved()
        call_id = self._read_until(_KIMI_ID_CHARS, self._ARGUMENT_BEGIN)
        if call_id is None:
            return self._starved()
        if isinstance(call_id, Malformed):
            return self._fail()
        parsed = _KIMI_ID.fullmatch(call_id)
        if parsed is None or not self._valid_name(parsed.group(1)):
            return self._fail()
        self._open_call(parsed.group(1), call_id)
        self._stream_json_arguments(self._to_call_end)
        return True
