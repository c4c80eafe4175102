"""Calls with one tag per argument: qwen3_coder, seed_oss, glm45, iquest and hunyuan.

Values are bare text between tags; the tool's JSON schema types them (`schema_types`). The
JSON arguments object is written as the tags arrive: `{` when the call commits, each key when
its value opens, and a string value character by character (escaped for JSON). Values of
other types are held until their closing tag, then converted. Junk between argument tags is
skipped (reported in `anomalies`); arguments already seen are kept. `XmlArgumentCalls` is
shared with the `<invoke name=...>` formats (`invoke_calls`) and Kimi K3 (`kimi_channel_calls`).
"""

from __future__ import annotations

import json
import re
from typing import Any, ClassVar, Final

from trio_direct.parsers.tools.schema_types import coerce_value
from trio_direct.parsers.tools.stream import ToolCallParser, first_marker, partial_marker_length

__all__ = ["Glm45Parser", "HunyuanParser", "IQuestParser", "Qwen3CoderParser", "SeedOssParser", "XmlArgumentCalls"]

_TOOL_CALL: Final = "<tool_call>"
_END_TOOL_CALL: Final = "</tool_call>"
_TAG_TEXT: Final = re.compile(r"[^<>\n]*")
_LINE_TEXT: Final = re.compile(r"[^<\n]*")


class XmlArgumentCalls(ToolCallParser):
    """Writes the JSON arguments object for tag-per-argument formats."""

    requires_special_tokens = True
    _INFER_UNTYPED: bool = False  # how a value of an unknown parameter is read
    _STRING_TYPES: tuple[tuple[str, ...], ...] = (("string",),)  # types streamed as strings
    # Write `{` as soon as the call commits (the name and the object start go out together);
    # formats whose body may be a raw JSON object instead wait for the first argument.
    _EAGER_OBJECT: bool = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._function = ""
        self._count = 0  # arguments written so far in this call
        self._object_open = False
        self._key = ""
        self._types: tuple[str, ...] = ()
        self._streaming_string = False
        self._in_value = False
        self._searched = 0  # chars after the cursor already searched for a held value's end

    def _commit(self, name: str) -> None:
        self._open_call(name)
        self._function, self._count = name, 0
        if self._EAGER_OBJECT:
            self._emit_arguments("{")
            self._object_open = True

    def _begin_value(self, types: tuple[str, ...] | None = None) -> None:
        """An argument `self._key` starts; `types` overrides the schema's (a format that says
        the value's type in its markup)."""
        self._types = self._schemas.types_of(self._function, self._key) if types is None else types
        self._streaming_string = self._types in self._STRING_TYPES
        separator = ", " if self._count else ""
        if not self._object_open:
            separator = "{"
            self._object_open = True
        self._count += 1
        self._in_value = True
        self._searched = 0
        self._emit_arguments(f"{separator}{json.dumps(self._key, ensure_ascii=False)}: ")
        if self._streaming_string:
            self._emit_arguments('"')

    def _string_piece(self, text: str) -> None:
        if text:
            self._emit_arguments(json.dumps(self._decode(text), ensure_ascii=False)[1:-1])

    def _end_value(self, raw: str) -> None:
        """Close the value: `raw` is the text not yet written (all of it, if not streamed)."""
        self._in_value = False
        if self._streaming_string:
            self._string_piece(raw)
            self._emit_arguments('"')
        else:
            raw = self._decode(raw)
            value: Any = (
                coerce_value(raw, self._types, infer=self._INFER_UNTYPED) if self._types else self._untyped_value(raw)
            )
            self._emit_arguments(json.dumps(value, ensure_ascii=False))

    # Format hooks for values.

    def _untyped_value(self, raw: str) -> Any:
        """The value of a parameter the schema does not type."""
        return coerce_value(raw, (), infer=self._INFER_UNTYPED)

    def _decode(self, text: str) -> str:
        """Undo the format's escaping of value text (none by default)."""
        return text

    def _decodable_end(self, text: str, start: int, end: int) -> int:
        """Where a streamed piece `text[start:end]` may end without cutting an escape in two."""
        return end

    def _starved(self) -> bool:
        if self._final and self._open is not None and self._in_value:
            # Cut off inside a value: close it so the arguments stay valid JSON. A held tail
            # of a streamed string is a cut-off closing tag or its framing newline.
            self._end_value("" if self._streaming_string else self._buf[self._pos :])
        return super()._starved()

    def _end_call(self) -> None:
        if self._object_open:
            self._emit_arguments("}")
            self._object_open = False
        self._close_call()

    def _close_call(self) -> None:
        if self._object_open:  # cut off or abandoned: still close the object
            self._emit_arguments("}")
            self._object_open = False
        super()._close_call()

    def _stream_value(self, terminators: tuple[str, ...], strip_newline: bool) -> tuple[int, str] | None:
        """Advance through a value up to its earliest terminator: `(index, terminator)` once
        seen (cursor still at the value's unwritten rest), else `None` (streamed what is safe).
        """
        buf, pos = self._buf, self._pos
        if not self._streaming_string:
            # The cursor waits at the value's start: search only what is new, so a long held
            # value costs linear time, not quadratic.
            overlap = max(map(len, terminators)) - 1
            hit = first_marker(buf, max(pos, pos + self._searched - overlap), terminators)
            self._searched = len(buf) - pos
            return hit
        hit = first_marker(buf, pos, terminators)
        if hit is not None:
            return hit
        safe = self._decodable_end(buf, pos, len(buf) - partial_marker_length(buf, pos, terminators))
        if strip_newline and safe > pos and buf[safe - 1] == "\n":
            safe -= 1  # may be the newline before the closing tag, which is not part of it
        self._string_piece(buf[pos:safe])
        self._pos = safe
        return None

    def _skip_junk(self) -> None:
        """Skip text that is not an argument tag, up to the next `<`."""
        buf, pos = self._buf, self._pos
        at = buf.find("<", pos + 1)
        self._anomaly(f"skipped junk between arguments: {buf[pos : at if at >= 0 else None]!r}")
        self._pos = at if at >= 0 else len(buf)


class Qwen3CoderParser(XmlArgumentCalls):
    """Qwen3-Coder (and Qwen3.5+): `<tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n
    </parameter>\\n</function>\\n</tool_call>`.

    One newline after `<parameter=KEY>` and one before `</parameter>` are framing, as in the
    chat template. A parameter also ends at the next `<parameter=`, `</function>` or
    `</tool_call>` (models skip closing tags). Parameters the schema does not type stay strings.
    Malformed: `<tool_call>` without a `<function=NAME>` stays content.
    """

    format = "qwen3_coder"
    MARKERS: ClassVar[tuple[str, ...]] = (_TOOL_CALL,)
    _BLOCK_END: ClassVar[str] = _END_TOOL_CALL
    _VALUE_ENDS: ClassVar[tuple[str, ...]] = ("</parameter>", "<parameter=", "</function>", _END_TOOL_CALL)
    _STRING_TYPES = ((), ("string",))
    _INFER_UNTYPED = False

    def _on_marker(self, marker: str, at: int) -> None:
        self._begin_attempt(at, self._pos)
        self._state = self._block

    def _block(self) -> bool:
        if not self._skip_ws():
            return self._starved()
        found = self._match("<function=")
        if found is None:
            return self._starved()
        if not found:
            return self._fail()
        self._state = self._function_name
        return True

    def _function_name(self) -> bool:
        buf, pos = self._buf, self._pos
        end = _TAG_TEXT.match(buf, pos).end()  # type: ignore[union-attr]
        if end == len(buf):
            return self._starved()
        name = buf[pos:end].strip()
        if buf[end] != ">" or not self._valid_name(name):
            return self._fail()
        self._pos = end + 1
        self._commit(name)
        self._state = self._body
        return True

    def _body(self) -> bool:
        if not self._skip_ws():
            return self._starved()
        found = self._match("<parameter=", "</function>", self._BLOCK_END)
        if found is None:
            return self._starved()
        if found == "<parameter=":
            self._state = self._parameter_name
        elif found == "</function>":
            self._end_call()
            self._state = self._after_function
        elif found:
            self._end_call()
            self._state = self._content
        else:
            self._skip_junk()
        return True

    def _parameter_name(self) -> bool:
        buf, pos = self._buf, self._pos
        end = _TAG_TEXT.match(buf, pos).end()  # type: ignore[union-attr]
        if end == len(buf):
            return self._starved()
        if buf[end] != ">":
            self._skip_junk()
            self._state = self._body
            return True
        self._key = buf[pos:end].strip()
        self._pos = end + 1
        self._begin_value()
        self._state = self._value_start
        return True

    def _value_start(self) -> bool:
        if self._pos >= len(self._buf):
            return self._starved()
        if self._buf[self._pos] == "\n":
            self._pos += 1
        self._state = self._value
        return True

    def _value(self) -> bool:
        hit = self._stream_value(self._VALUE_ENDS, strip_newline=True)
        if hit is None:
            return self._starved()
        at, terminator = hit
        raw = self._buf[self._pos : at]
        self._end_value(raw.removesuffix("\n"))
        self._pos = at + (len(terminator) if terminator == "</parameter>" else 0)
        self._state = self._body
        return True

    def _after_function(self) -> bool:
        if not self._skip_ws():
            return self._starved()
        found = self._match(self._BLOCK_END, "<function=")
        if found is None:
            return self._starved()
        if found == "<function=":  # another call in the same block
            self._begin_attempt(self._pos - len(found), self._pos)
            self._state = self._function_name
        else:
            self._state = self._content
        return True


class SeedOssParser(Qwen3CoderParser):
    """ByteDance Seed-OSS: Qwen3-Coder's tags inside `<seed:tool_call>` ... `</seed:tool_call>`.

    Values go without framing newlines (`<parameter=city>Paris</parameter>`); one is dropped
    when present, as for Qwen3-Coder. Malformed: `<seed:tool_call>` without a `<function=NAME>`
    stays content.
    """

    format = "seed_oss"
    MARKERS = ("<seed:tool_call>",)
    _BLOCK_END = "</seed:tool_call>"
    _VALUE_ENDS = ("</parameter>", "<parameter=", "</function>", "</seed:tool_call>")


class Glm45Parser(XmlArgumentCalls):
    """GLM-4.5 / 4.6 (and 4.7, which drops the newlines): `<tool_call>NAME\\n<arg_key>KEY
    </arg_key>\\n<arg_value>VALUE</arg_value>\\n</tool_call>`.

    String values are the raw text between the tags; other values are JSON (the template
    writes them with `tojson`); values of parameters the schema does not type are read as JSON
    when they parse, else kept as strings. Malformed: `<tool_call>` not followed by a function
    name stays content.
    """

    format = "glm45"
    MARKERS: ClassVar[tuple[str, ...]] = (_TOOL_CALL,)
    _CALL_END: ClassVar[str] = _END_TOOL_CALL
    _INFER_UNTYPED = True

    def _on_marker(self, marker: str, at: int) -> None:
        self._begin_attempt(at, self._pos)
        self._state = self._name

    def _name(self) -> bool:
        buf, pos = self._buf, self._pos
        end = _LINE_TEXT.match(buf, pos).end()  # type: ignore[union-attr]
        name = buf[pos:end].strip()
        if name and not self._valid_name(name):
            return self._fail()  # prose after `<tool_call>`, or another format
        if end == len(buf):
            return self._starved()
        if not name:
            if buf[end] == "\n":
                self._pos = end + 1  # a newline before the name
                return True
            return self._fail()
        self._pos = end
        self._commit(name)
        self._state = self._body
        return True

    def _body(self) -> bool:
        if not self._skip_ws():
            return self._starved()
        found = self._match("<arg_key>", self._CALL_END)
        if found is None:
            return self._starved()
        if found == "<arg_key>":
            self._state = self._key_text
        elif found:
            self._end_call()
            self._state = self._content
        else:
            self._skip_junk()
        return True

    def _key_text(self) -> bool:
        at = self._buf.find("</arg_key>", self._pos)
        if at < 0:
            return self._starved()
        self._key = self._buf[self._pos : at].strip()
        self._pos = at + len("</arg_key>")
        self._state = self._value_open
        return True

    def _value_open(self) -> bool:
        if not self._skip_ws():
            return self._starved()
        found = self._match("<arg_value>", "<arg_key>", self._CALL_END)
        if found is None:
            return self._starved()
        if found == "<arg_value>":
            self._begin_value()
            self._state = self._value
        elif found == "<arg_key>":
            self._anomaly(f"argument {self._key!r} has no value; dropped")
            self._state = self._key_text
        elif found:
            self._end_call()
            self._state = self._content
        else:
            self._skip_junk()
        return True

    def _value(self) -> bool:
        hit = self._stream_value(("</arg_value>",), strip_newline=False)
        if hit is None:
            return self._starved()
        at, terminator = hit
        self._end_value(self._buf[self._pos : at])
        self._pos = at + len(terminator)
        self._state = self._body
        return True


class IQuestParser(Glm45Parser):
    """IQuest-Q1: GLM's keyed arguments inside `<iquest_tool_call>NAME<arg_key>KEY</arg_key>
    <arg_value>VALUE</arg_value></iquest_tool_call>`, with no newlines (smg's `iquest` table)."""

    format = "iquest"
    MARKERS = ("<iquest_tool_call>",)
    _CALL_END = "</iquest_tool_call>"


class HunyuanParser(XmlArgumentCalls):
    """Tencent Hunyuan (Hy3): `<tool_calls>\\n<tool_call>NAME<tool_sep>\\n<arg_key>KEY</arg_key>\\n
    <arg_value>VALUE</arg_value>\\n</tool_call>\\n</tool_calls>`; Hy4 (smg's `hy4` / `hy_v4`) writes
    no `<tool_sep>`: `<tool_calls:opensource><tool_call:opensource>NAME<arg_key:opensource>...`.

    Shipping tokenizers suffix every tag (`<tool_calls:opensource>`); the suffix on the opening
    `<tool_calls...>` is the one expected on every later tag. Values are typed by the schema, and
    untyped ones read as JSON when they parse (else strings). Malformed: `<tool_calls>` not followed
    by `<tool_call>NAME` and `<tool_sep>` or an argument tag stays content.
    """

    format = "hunyuan"
    MARKERS = ("<tool_calls",)
    _INFER_UNTYPED = True
    _SUFFIX: Final = re.compile(r"(?::[^<>\s]*)?>")
    _SUFFIX_PREFIX: Final = re.compile(r"(?::[^<>\s]*)?")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._tags: dict[str, str] = {}

    def _on_marker(self, marker: str, at: int) -> None:
        self._begin_attempt(at, self._pos)
        self._state = self._section_suffix

    def _section_suffix(self) -> bool:
        buf, pos = self._buf, self._pos
        found = self._SUFFIX.match(buf, pos)
        if found is None:
            grows = self._SUFFIX_PREFIX.match(buf, pos)
            if grows is not None and grows.end() == len(buf):
                return self._starved()
            return self._fail()  # `<tool_callsXYZ`: not this markup
        suffix = buf[pos : found.end() - 1]
        self._pos = found.end()
        self._tags = {name: f"<{name}{suffix}>" for name in ("tool_call", "tool_sep", "arg_key", "arg_value")}
        self._tags.update(
            {f"/{name}": f"</{name}{suffix}>" for name in ("tool_calls", "tool_call", "arg_key", "arg_value")}
        )
        self._state = self._between
        return True

    def _between(self) -> bool:
        if not self._skip_ws():
            return self._starved()
        found = self._match(self._tags["tool_call"], self._tags["/tool_calls"])
        if found is None:
            return self._starved()
        if found == self._tags["tool_call"]:
            if self._mark is None:
                self._begin_attempt(self._pos - len(found), self._pos)
            self._state = self._name
        elif found and self._mark is not None:  # `<tool_calls></tool_calls>`: no call, so content
            return self._fail()
        elif found:
            self._state = self._content
        elif self._mark is not None:
            return self._fail()
        else:  # text after an unclosed section: content
            self._state = self._content
        return True

    def _name(self) -> bool:
        buf, pos = self._buf, self._pos
        sep = self._tags["tool_sep"]
        end = _LINE_TEXT.match(buf, pos).end()  # type: ignore[union-attr]
        name = buf[pos:end].strip()
        if name and not self._valid_name(name):
            return self._fail()
        if end == len(buf):
            return self._starved()
        # Hy3 writes `<tool_sep>` after the name; Hy4 goes straight to the first argument or the
        # call's end.
        follows = (sep, self._tags["arg_key"], self._tags["/tool_call"])
        found = next((tag for tag in follows if buf.startswith(tag, end)), None)
        if found is None:
            rest = buf[end:]
            if not self._final and any(tag.startswith(rest) for tag in follows):
                return self._starved()
            return self._fail()
        if not name:
            return self._fail()
        self._pos = end + (len(sep) if found == sep else 0)
        self._commit(name)
        self._state = self._body
        return True

    def _body(self) -> bool:
        if not self._skip_ws():
            return self._starved()
        found = self._match(self._tags["arg_key"], self._tags["/tool_call"])
        if found is None:
            return self._starved()
        if found == self._tags["arg_key"]:
            self._state = self._key_text
        elif found:
            self._end_call()
            self._state = self._between
        else:
            self._skip_junk()
        return True

    def _key_text(self) -> bool:
        end_tag = self._tags["/arg_key"]
        at = self._buf.find(end_tag, self._pos)
        if at < 0:
            return self._starved()
        self._key = self._buf[self._pos : at].strip()
        self._pos = at + len(end_tag)
        self._state = self._value_open
        return True

    def _value_open(self) -> bool:
        if not self._skip_ws():
            return self._starved()
        found = self._match(self._tags["arg_value"], self._tags["arg_key"], self._tags["/tool_call"])
        if found is None:
            return self._starved()
        if found == self._tags["arg_value"]:
            self._begin_value()
            self._state = self._value
        elif found == self._tags["arg_key"]:
            self._anomaly(f"argument {self._key!r} has no value; dropped")
            self._state = self._key_text
        elif found:
            self._end_call()
            self._state = self._between
        else:
            self._skip_junk()
        return True

    def _value(self) -> bool:
        end_tag = self._tags["/arg_value"]
        hit = self._stream_value((end_tag,), strip_newline=False)
        if hit is None:
            return self._starved()
        at, _ = hit
        self._end_value(self._buf[self._pos : at])
        self._pos = at + len(end_tag)
        self._state = self._body
        return True
