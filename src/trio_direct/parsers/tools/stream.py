"""The streaming driver every tool-call format plugs into.

A parser is a state machine over one buffer. Each state is a method that looks at the text
from the cursor on and either makes progress (consumes text, emits content or call pieces,
switches state) or reports that it cannot decide yet. A state decides only from text that has
arrived; when it needs more, it waits, and at the end of the stream it takes its fallback.
So every decision depends on the text alone, never on where the deltas were cut, and
streaming over any chunking gives what parsing the whole text gives (property-tested).

Content holds back only a suffix that could still become a start marker. Once a marker is
seen, the parser *attempts* a call: nothing of it is emitted until the call is *committed*
(its name is known and valid). If the markup turns out malformed before that, the attempt
rolls back: the marker is emitted as content and scanning resumes right after it, so nothing
is dropped. After commit the call streams; the name goes out once, the arguments in pieces as
they arrive (never held until the end, dynamo#13975). A committed call that goes wrong later
is ended as it stands, and `anomalies` says so.

Whitespace that only separates content from markup (the `\\n\\n` before `<tool_call>`, between
calls, after the last one) belongs to the markup and is not content; text without any tool
markup passes through unchanged.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Final

from trio_direct.parsers.markers import first_marker, partial_marker_length
from trio_direct.parsers.tools.deltas import ToolCall, ToolCallDelta, ToolDelta, assemble, new_call_id
from trio_direct.parsers.tools.schema_types import ToolSchemas
from trio_direct.parsers.tools.value_scan import BROKEN, JsonValueScanner

__all__ = ["MALFORMED", "Malformed", "ToolCallParser", "first_marker", "partial_marker_length"]

# Function names as models write them: OpenAI's `[A-Za-z0-9_-]`, plus dots and any letters.
_NAME: Final = re.compile(r"[\w.\-]{1,256}")
_JSON_STRING: Final = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)


class Malformed:
    """The type of `MALFORMED`, for annotations."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "MALFORMED"


MALFORMED: Final = Malformed()  # a helper's answer: the text cannot be what was expected


@dataclass(slots=True)
class _OpenCall:
    index: int
    name: str
    has_arguments: bool = False


class ToolCallParser:
    """One choice's incremental tool-call parser: `feed` every delta in order, then `finish`.

    `tools` (OpenAI request `tools`) only types untyped values in XML-style formats; calls
    to functions not in `tools` are still reported, for the client to reject. `rng` makes the
    generated call ids reproducible in tests. The base class is the passthrough format: no
    markup, all text is content.
    """

    format: ClassVar[str] = "passthrough"
    MARKERS: ClassVar[tuple[str, ...]] = ()  # start markers recognised in content
    # Markup formats set this: their markers are (or may be) special tokens, which the
    # detokenizer drops unless told to keep them (see `ToolParser.requires_special_tokens`).
    requires_special_tokens: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for marker in cls.MARKERS:
            for other in cls.MARKERS:
                if other != marker and other in marker:
                    # The earliest complete marker would then depend on the chunking.
                    raise TypeError(f"{cls.__name__}: marker {marker!r} contains {other!r}")

    def __init__(self, tools: Sequence[Mapping[str, Any]] | None = None, *, rng: random.Random | None = None) -> None:
        self.anomalies: list[str] = []  # malformed or cut-off markup seen, for the logs
        self._schemas = ToolSchemas(tools)
        self._rng = rng if rng is not None else random.SystemRandom()
        self._buf = ""
        self._pos = 0
        self._mark: int | None = None  # where the current uncommitted attempt began
        self._resume = 0  # where content resumes if that attempt rolls back
        self._markup_attempt = True
        self._final = False
        self._finished = False
        self._state: Callable[[], bool] = self._start
        self._content_out: list[str] = []
        self._calls_out: list[ToolCallDelta] = []
        self._held_ws = ""
        self._strip_leading = False
        self._open: _OpenCall | None = None
        self._next_index = 0
        self._scanner = JsonValueScanner()
        self._arguments_done: Callable[[], None] = self._no_op

    # Public interface.

    def feed(self, text: str) -> ToolDelta:
        """Parse one delta; returns content and call pieces that are now certain."""
        if self._finished:
            raise RuntimeError("feed() after finish(): a tool-call parser serves one stream")
        self._buf += text
        self._run()
        return self._take()

    def finish(self) -> ToolDelta:
        """End of stream: held text is decided (content, or the end of a cut-off call)."""
        if self._finished:
            return ToolDelta()
        self._finished = True
        self._final = True
        self._run()
        if self._pos < len(self._buf) or self._open is not None:  # pragma: no cover - a bug
            self.anomalies.append(f"{self.format}: parser stopped early; rest kept as content")
            if self._open is not None:
                self._close_call()
            self._emit_content(self._buf[self._pos :])
            self._pos = len(self._buf)
        if self._held_ws:
            self._content_out.append(self._held_ws)
            self._held_ws = ""
        return self._take()

    @property
    def call_count(self) -> int:
        """Calls committed so far (a response with any has `finish_reason: "tool_calls"`)."""
        return self._next_index

    def parse_complete(self, text: str) -> tuple[str, list[ToolCall]]:
        """Parse a whole unary response: equal to joining the streamed deltas of `text`."""
        return assemble((self.feed(text), self.finish()))

    # Format hooks.

    def _start(self) -> bool:
        """The first state; formats that recognise calls at the very start override it."""
        self._state = self._content
        return True

    def _on_marker(self, marker: str, at: int) -> None:  # pragma: no cover - no markers here
        """A complete start marker at `at`; the cursor is already past it."""
        raise AssertionError(marker)

    def _recover(self) -> bool:
        """A committed call's markup went wrong: end the call; what follows is content."""
        self._anomaly("malformed markup after a committed call; call ended there")
        if self._open is not None:
            self._close_call()
        self._state = self._content
        return True

    # The content state.

    def _content(self) -> bool:
        buf, pos = self._buf, self._pos
        if pos >= len(buf):
            return False
        hit = first_marker(buf, pos, self.MARKERS)
        if hit is not None:
            at, marker = hit
            self._emit_content(buf[pos:at])
            self._pos = at + len(marker)
            self._on_marker(marker, at)
            return True
        end = len(buf) if self._final else len(buf) - partial_marker_length(buf, pos, self.MARKERS)
        self._emit_content(buf[pos:end])
        self._pos = end
        return False

    # Driving.

    def _run(self) -> None:
        while self._state():
            pass
        cut = self._pos if self._mark is None else min(self._pos, self._mark)
        if cut:
            self._buf = self._buf[cut:]
            self._pos -= cut
            if self._mark is not None:
                self._mark -= cut
                self._resume -= cut

    def _take(self) -> ToolDelta:
        delta = ToolDelta("".join(self._content_out), self._calls_out)
        self._content_out = []
        self._calls_out = []
        return delta

    # Decisions shared by the formats.

    def _starved(self) -> bool:
        """The state needs more text: wait, or at the end of the stream take the fallback."""
        if not self._final:
            return False
        if self._open is not None:
            self._anomaly(f"tool call {self._open.name!r} cut off by the end of the stream")
            self._pos = len(self._buf)
            self._close_call()
            self._state = self._content
        elif self._mark is not None:
            self._rollback()
        else:  # between calls: what is left is a cut-off marker, dropped with the markup
            if self._pos < len(self._buf):
                self._anomaly(f"cut-off markup dropped: {self._buf[self._pos :]!r}")
            self._pos = len(self._buf)
            self._state = self._content
        return True

    def _fail(self) -> bool:
        """The text is not the markup this state expects."""
        if self._mark is not None:
            self._rollback()
            return True
        return self._recover()

    def _begin_attempt(self, at: int, resume: int, *, markup: bool = True) -> None:
        """A call may start at `at`; on rollback, `buf[at:resume]` becomes content."""
        self._mark, self._resume, self._markup_attempt = at, resume, markup

    def _rollback(self) -> None:
        mark, resume = self._mark, self._resume
        assert mark is not None
        self._mark = None
        if self._markup_attempt:
            self._anomaly(f"malformed tool call after {self._buf[mark:resume]!r} kept as content")
        self._emit_content(self._buf[mark:resume])
        self._pos = resume
        self._state = self._content

    def _no_op(self) -> None:
        pass

    def _anomaly(self, what: str) -> None:
        self.anomalies.append(f"{self.format}: {what}")

    # Emitting.

    def _emit_content(self, text: str) -> None:
        """Append content. Trailing whitespace waits: the next text releases it, the next call
        drops it (it only separated prose from markup); after a call, leading spaces go."""
        if not text:
            return
        if self._strip_leading:
            text = text.lstrip()
            if not text:
                return
            self._strip_leading = False
        text = self._held_ws + text
        body = text.rstrip()
        self._held_ws = text[len(body) :]  # released by later text, dropped by a call
        if body:
            self._content_out.append(body)

    def _open_call(self, name: str, call_id: str | None = None) -> None:
        """Commit: the call is certain from here on, and its id and name go out."""
        index = self._next_index
        self._next_index += 1
        self._open = _OpenCall(index, name)
        self._calls_out.append(ToolCallDelta(index, call_id or self._new_id(), name, ""))
        self._held_ws = ""
        self._mark = None

    def _emit_arguments(self, text: str) -> None:
        call = self._open
        if not text or call is None:
            return
        call.has_arguments = True
        last = self._calls_out[-1] if self._calls_out else None
        if last is not None and last.index == call.index:
            last.arguments += text
        else:
            self._calls_out.append(ToolCallDelta(call.index, None, None, text))

    def _close_call(self) -> None:
        if self._open is not None and not self._open.has_arguments:
            self._emit_arguments("{}")  # never an empty arguments string
        self._open = None
        self._strip_leading = True

    def _new_id(self) -> str:
        return new_call_id(self._rng)

    # Raw JSON arguments, streamed as written (formats that put a JSON object after a marker).

    def _stream_json_arguments(self, done: Callable[[], None]) -> None:
        """From the cursor (after optional spaces), stream one JSON object or array as the open
        call's arguments, then call `done` once."""
        self._arguments_done = done
        self._scanner = JsonValueScanner()
        self._state = self._json_arguments_open

    def _json_arguments_open(self) -> bool:
        if not self._skip_ws():
            return self._starved()
        if self._buf[self._pos] not in "{[":
            return self._fail()
        self._state = self._json_arguments
        return True

    def _json_arguments(self) -> bool:
        buf, start = self._buf, self._pos
        end = self._scanner.scan(buf, start, self._final)
        if end is None:
            self._emit_arguments(buf[start:])
            self._pos = len(buf)
            return self._starved()
        if end == BROKEN:
            self._emit_arguments(buf[start : self._scanner.broken_at])
            self._pos = self._scanner.broken_at
            return self._fail()
        self._emit_arguments(buf[start:end])
        self._pos = end
        self._arguments_done()
        return True

    # Reading.

    def _skip_ws(self) -> bool:
        """Consume whitespace; True when a non-space character is next."""
        buf, pos = self._buf, self._pos
        n = len(buf)
        while pos < n and buf[pos].isspace():
            pos += 1
        self._pos = pos
        return pos < n

    def _match(self, *literals: str) -> str | None:
        """Consume whichever literal starts at the cursor (longest first).

        Returns it, `""` when none can, or `None` when the text so far is a proper prefix of
        one and more may arrive.
        """
        buf, pos = self._buf, self._pos
        for literal in sorted(literals, key=len, reverse=True):
            if buf.startswith(literal, pos):
                self._pos = pos + len(literal)
                return literal
            rest = buf[pos : pos + len(literal)]
            if not self._final and literal.startswith(rest):
                return None
        return ""

    def _json_string(self) -> str | Malformed | None:
        """Read a complete JSON string at the cursor; `None` while its end has not arrived."""
        buf, pos = self._buf, self._pos
        if not buf.startswith('"', pos):
            return MALFORMED
        found = _JSON_STRING.match(buf, pos)
        if found is None:
            return MALFORMED if self._final else None
        try:
            value = json.loads(found.group(), strict=False)
        except ValueError:
            return MALFORMED
        self._pos = found.end()
        return value

    @staticmethod
    def _valid_name(name: str) -> bool:
        return _NAME.fullmatch(name) is not None
