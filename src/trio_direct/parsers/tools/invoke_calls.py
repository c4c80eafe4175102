"""Calls as `<invoke name="NAME">` elements with `<parameter name="KEY">VALUE</parameter>` children:
minimax_m2, step3 and DeepSeek's DSML (deepseek_v32, deepseek_v4).

The three differ in tag prefixes, in the section around the calls and in how a value's type is
known: MiniMax writes XML entities and leaves values untyped, Step3 leaves them untyped, DSML says
`string="true|false"` on each parameter (and may write a raw JSON object instead of parameters).
Values stream as `XmlArgumentCalls` writes them; a call commits when its `name` attribute is read.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Callable
from typing import Any, ClassVar, Final

from trio_direct.parsers.tools.argument_tag_calls import XmlArgumentCalls
from trio_direct.parsers.tools.stream import MALFORMED, Malformed

__all__ = [
    "DeepSeekV4Parser",
    "DeepSeekV32Parser",
    "DeepSeekV41Parser",
    "InvokeCalls",
    "MinimaxM2Parser",
    "Step3Parser",
]

# The attributes of a tag, up to its `>`: ` name="get_weather" string="true"`.
_ATTRIBUTES: Final = re.compile(r'((?:\s+[\w\-]+\s*=\s*"[^"]*")*)\s*>')
_ATTRIBUTE: Final = re.compile(r'([\w\-]+)\s*=\s*"([^"]*)"')
_MAX_TAG: Final = 1024  # an opening tag longer than this is not one


class InvokeCalls(XmlArgumentCalls):
    """A section of `<invoke>` calls; subclasses give the tags (each a class attribute)."""

    SECTION_CLOSE: ClassVar[str]
    CALL_OPEN: ClassVar[tuple[str, ...]]  # literals before the invoke's attributes (spaces between)
    CALL_CLOSE: ClassVar[tuple[str, ...]]  # literals that end a call
    PARAMETER_OPEN: ClassVar[str]
    PARAMETER_CLOSE: ClassVar[str]
    _RAW_JSON_BODY: ClassVar[bool] = False  # an invoke may hold a JSON object instead of parameters

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._step = 0  # position in CALL_OPEN / CALL_CLOSE

    def _on_marker(self, marker: str, at: int) -> None:
        self._begin_attempt(at, self._pos)
        self._state = self._between

    # Between calls: the next call, or the section's end.

    def _between(self) -> bool:
        if not self._skip_ws():
            return self._starved()
        found = self._match(self.CALL_OPEN[0], self.SECTION_CLOSE)
        if found is None:
            return self._starved()
        if found == self.CALL_OPEN[0]:
            if self._mark is None:
                self._begin_attempt(self._pos - len(found), self._pos)
            self._step = 1
            self._state = self._call_open
        elif found:
            self._state = self._content
        elif self._mark is not None:
            return self._fail()  # the section holds no call: not this markup
        else:
            self._state = self._content  # text after an unclosed section
        return True

    def _call_open(self) -> bool:
        if self._step < len(self.CALL_OPEN):
            return self._literal(self.CALL_OPEN, self._call_open)
        attributes = self._attributes()
        if attributes is None:
            return self._starved()
        if isinstance(attributes, Malformed):
            return self._fail()
        name = attributes.get("name", "").strip()
        if not self._valid_name(name):
            return self._fail()
        self._commit(name)
        self._state = self._body
        return True

    def _literal(self, literals: tuple[str, ...], state: Callable[[], bool]) -> bool:
        """Match `literals[self._step]` (after spaces), then stay in `state` for the next one."""
        if not self._skip_ws():
            return self._starved()
        found = self._match(literals[self._step])
        if found is None:
            return self._starved()
        if not found:
            return self._fail()
        self._step += 1
        self._state = state
        return True

    def _attributes(self) -> dict[str, str] | Malformed | None:
        """Read a tag's attributes through its `>`; `None` while the `>` has not arrived."""
        buf, pos = self._buf, self._pos
        found = _ATTRIBUTES.match(buf, pos)
        if found is None:
            end = buf.find(">", pos)
            if end < 0 and "<" not in buf[pos:] and len(buf) - pos < _MAX_TAG and not self._final:
                return None
            return MALFORMED
        self._pos = found.end()
        return {key: html.unescape(value) for key, value in _ATTRIBUTE.findall(found.group(1))}

    # Inside a call.

    def _body(self) -> bool:
        if not self._skip_ws():
            return self._starved()
        if self._RAW_JSON_BODY and not self._count and self._buf[self._pos] == "{":
            self._stream_json_arguments(self._to_call_close)
            return True
        found = self._match(self.PARAMETER_OPEN, self.CALL_CLOSE[0])
        if found is None:
            return self._starved()
        if found == self.PARAMETER_OPEN:
            self._state = self._parameter_open
        elif found:
            self._end_call()
            self._step = 1
            self._state = self._call_close
        else:
            self._skip_junk()
        return True

    def _to_call_close(self) -> None:
        self._step = 0
        self._state = self._call_close

    def _call_close(self) -> bool:
        """The call's closing literals; once the first is seen, missing later ones are forgiven."""
        if self._step >= len(self.CALL_CLOSE):
            self._state = self._between
            return True
        if self._step == 0:
            return self._literal(self.CALL_CLOSE, self._call_close_first)
        if not self._skip_ws():
            return self._starved()
        found = self._match(self.CALL_CLOSE[self._step])
        if found is None:
            return self._starved()
        self._step = len(self.CALL_CLOSE) if not found else self._step + 1
        return True

    def _call_close_first(self) -> bool:
        self._end_call()
        self._state = self._call_close
        return True

    def _parameter_open(self) -> bool:
        attributes = self._attributes()
        if attributes is None:
            return self._starved()
        if isinstance(attributes, Malformed) or not attributes.get("name"):
            self._skip_junk()
            self._state = self._body
            return True
        self._key = attributes["name"].strip()
        self._begin_value(self._declared_types(attributes))
        self._state = self._value
        return True

    def _declared_types(self, attributes: dict[str, str]) -> tuple[str, ...] | None:
        """The value's types as the markup declares them; `None` lets the schema decide."""
        return None

    def _value(self) -> bool:
        hit = self._stream_value((self.PARAMETER_CLOSE, self.CALL_CLOSE[0]), strip_newline=False)
        if hit is None:
            return self._starved()
        at, terminator = hit
        self._end_value(self._buf[self._pos : at])
        self._pos = at + (len(terminator) if terminator == self.PARAMETER_CLOSE else 0)
        self._state = self._body
        return True

    def _recover(self) -> bool:
        self._anomaly("malformed tool call; skipped to its end")
        self._state = self._skip_to_call_end
        return True

    def _skip_to_call_end(self) -> bool:
        buf, pos = self._buf, self._pos
        end = self.CALL_CLOSE[-1]
        at = buf.find(end, pos)
        if at < 0:
            self._pos = max(pos, len(buf) - len(end) + 1)
            return self._starved()
        self._pos = at + len(end)
        self._end_call()
        self._state = self._between
        return True


class MinimaxM2Parser(InvokeCalls):
    """MiniMax-M2: `<minimax:tool_call>\\n<invoke name="NAME">\\n<parameter name="KEY">VALUE
    </parameter>\\n</invoke>\\n</minimax:tool_call>`; parallel calls are several invokes.

    Values are XML-escaped (`&lt;`, `&amp;`, ...); the schema types them, and untyped ones are read
    as `true`/`false`/`null` (or Python's spellings) or numbers when they are one, else strings,
    as MiniMax's reference parser does. Malformed: a section without a valid invoke stays content.
    """

    format = "minimax_m2"
    MARKERS = ("<minimax:tool_call>",)
    SECTION_CLOSE = "</minimax:tool_call>"
    CALL_OPEN = ("<invoke",)
    CALL_CLOSE = ("</invoke>",)
    PARAMETER_OPEN = "<parameter"
    PARAMETER_CLOSE = "</parameter>"
    _ENTITIES: Final = {"&lt;": "<", "&gt;": ">", "&amp;": "&", "&quot;": '"', "&apos;": "'"}
    _LITERALS: Final[dict[str, Any]] = {
        "true": True,
        "True": True,
        "false": False,
        "False": False,
        "null": None,
        "None": None,
    }

    def _decode(self, text: str) -> str:
        return re.sub(r"&(?:lt|gt|amp|quot|apos);", lambda m: self._ENTITIES[m.group()], text)

    def _decodable_end(self, text: str, start: int, end: int) -> int:
        amp = text.rfind("&", start, end)
        if amp >= 0 and ";" not in text[amp:end] and end - amp < 6:
            return amp  # maybe the start of an entity: wait for the rest
        return end

    def _untyped_value(self, raw: str) -> Any:
        if raw in self._LITERALS:
            return self._LITERALS[raw]
        if re.fullmatch(r"[-+]?\d+", raw):
            return int(raw)
        try:
            number = float(raw)
        except ValueError:
            return raw
        return number if math.isfinite(number) else raw


class Step3Parser(InvokeCalls):
    """StepFun Step-3: `<｜tool_calls_begin｜><｜tool_call_begin｜>function<｜tool_sep｜>
    <steptml:invoke name="NAME"><steptml:parameter name="KEY">VALUE</steptml:parameter>
    </steptml:invoke><｜tool_call_end｜><｜tool_calls_end｜>`.

    Values are typed by the schema; untyped ones are read as JSON when they parse, else kept as
    strings. Malformed: a section whose call is not `function` + a steptml invoke stays content.
    """

    format = "step3"
    MARKERS = ("<\uff5ctool_calls_begin\uff5c>",)
    SECTION_CLOSE = "<\uff5ctool_calls_end\uff5c>"
    CALL_OPEN = ("<\uff5ctool_call_begin\uff5c>", "function", "<\uff5ctool_sep\uff5c>", "<steptml:invoke")
    CALL_CLOSE = ("</steptml:invoke>", "<\uff5ctool_call_end\uff5c>")
    PARAMETER_OPEN = "<steptml:parameter"
    PARAMETER_CLOSE = "</steptml:parameter>"
    _INFER_UNTYPED = True


class DeepSeekV32Parser(InvokeCalls):
    """DeepSeek V3.2 DSML: `<｜DSML｜function_calls>\\n<｜DSML｜invoke name="NAME">\\n
    <｜DSML｜parameter name="KEY" string="true">VALUE</｜DSML｜parameter>\\n</｜DSML｜invoke>\\n
    </｜DSML｜function_calls>`.

    `string="true"` values are strings, streamed as they come; `string="false"` ones are JSON
    (kept as strings when they do not parse). An invoke may hold a raw JSON object instead of
    parameters. Malformed: a block without a valid invoke stays content.
    """

    format = "deepseek_v32"
    _BLOCK: ClassVar[str] = "function_calls"
    MARKERS = ("<\uff5cDSML\uff5cfunction_calls>",)
    SECTION_CLOSE = "</\uff5cDSML\uff5cfunction_calls>"
    CALL_OPEN = ("<\uff5cDSML\uff5cinvoke",)
    CALL_CLOSE = ("</\uff5cDSML\uff5cinvoke>",)
    PARAMETER_OPEN = "<\uff5cDSML\uff5cparameter"
    PARAMETER_CLOSE = "</\uff5cDSML\uff5cparameter>"
    _EAGER_OBJECT = False
    _RAW_JSON_BODY = True
    _INFER_UNTYPED = True

    def _declared_types(self, attributes: dict[str, str]) -> tuple[str, ...] | None:
        flag = attributes.get("string")
        if flag == "true":
            return ("string",)
        if flag == "false":
            return ()  # JSON, whatever the schema says: the model said so
        return None


class DeepSeekV4Parser(DeepSeekV32Parser):
    """DeepSeek V4 DSML: V3.2's grammar with `tool_calls` as the outer block's name."""

    format = "deepseek_v4"
    MARKERS = ("<\uff5cDSML\uff5ctool_calls>",)
    SECTION_CLOSE = "</\uff5cDSML\uff5ctool_calls>"


class DeepSeekV41Parser(DeepSeekV32Parser):
    """DeepSeek V4.1 DSML (smg's `deepseek_v4.1` table and `deepseek_v41` parser): V3.2's grammar
    with a space after `｜DSML｜` in every tag and `calls` as the outer block's name:
    `<｜DSML｜ calls>\\n<｜DSML｜ invoke name="N">\\n<｜DSML｜ parameter name="K" string="true">V
    </｜DSML｜ parameter>\\n</｜DSML｜ invoke>\\n</｜DSML｜ calls>`."""

    format = "deepseek_v41"
    MARKERS = ("<\uff5cDSML\uff5c calls>",)
    SECTION_CLOSE = "</\uff5cDSML\uff5c calls>"
    CALL_OPEN = ("<\uff5cDSML\uff5c invoke",)
    CALL_CLOSE = ("</\uff5cDSML\uff5c invoke>",)
    PARAMETER_OPEN = "<\uff5cDSML\uff5c parameter"
    PARAMETER_CLOSE = "</\uff5cDSML\uff5c parameter>"
