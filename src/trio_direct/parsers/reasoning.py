"""Reasoning parsers: split a choice's text into OpenAI `reasoning_content` and `content`.

Peer gateways' streaming parsers have lost text at delta boundaries, lacked an end-of-stream
flush and leaked split tags (sglang#31915, dynamo#10569). Here every format is a small state
machine over *markers* (tags such as `<think>`), and one loop drives them all:

* text between markers is routed by the current state (reasoning or content);
* a complete marker changes the state and is never emitted as text;
* only a suffix that could still grow into a marker of the current state is held back, and
  `finish()` releases it as plain text, so nothing is lost.

No marker of a state may contain another of the same state; then "the earliest complete marker
wins" gives the same answer for every chunking of the text (property-tested), equal to
parsing the whole text at once.

Formats (names as SGLang, smg and Dynamo spell them are aliases, see `KNOWN_REASONING_PARSERS`):

* `basic`: `<think>...</think>`, reasoning only inside explicit tags.
* `deepseek_r1`, `step3`: reasoning starts implicitly; everything before `</think>` is
  reasoning and a leading `<think>` is optional (R1 omits it, R1-0528 emits it).
* `qwen3`, `glm45`: `<think>...</think>`. With thinking on (the default, as in SGLang) the
  output starts in reasoning, because newer templates put `<think>` in the prompt; with
  `enable_thinking=False` the template has closed the block already and output starts as
  content. `<tool_call>` inside reasoning ends it and stays in content for the tool parser
  (Qwen3.5 and GLM open tool calls without `</think>`).
* `qwen3_thinking`: `qwen3` that always starts in reasoning (SGLang's `qwen3-thinking`).
* `kimi`: `◁think▷...◁/think▷`, explicit tags only.
* `gpt_oss`: harmony channels, see `HarmonyParser`.
* `passthrough`: everything is content.

Deliberate differences from SGLang's detectors (whose streaming and one-shot results disagree
with each other on these inputs): a second `<think>` after `</think>` opens another reasoning
section instead of leaking into content; a stray `</think>` in content and a repeated `<think>`
inside reasoning are dropped instead of shown; text before a mid-stream `<think>` stays content.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from types import MappingProxyType
from typing import Final

from trio_direct.parsers.markers import first_marker, partial_marker_length

__all__ = [
    "KNOWN_REASONING_PARSERS",
    "HarmonyParser",
    "PassthroughParser",
    "ReasoningDelta",
    "ReasoningParser",
    "ThinkTagParser",
    "UnknownReasoningParser",
    "reasoning_parser",
]


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    """Text to append to a choice's `reasoning_content` and `content`; either may be empty."""

    reasoning: str = ""
    content: str = ""

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.content)


class UnknownReasoningParser(ValueError):
    """No reasoning format has this name; the message lists the known ones."""


class ReasoningParser:
    """One choice's incremental splitter: `feed` every delta in order, then `finish` once.

    Subclasses describe a format through four hooks: the markers active in the current state,
    what to do with plain text, what a complete marker does, and what to flush at the end.
    """

    __slots__ = ("_pending", "_reasoning", "_content", "_finished")

    def __init__(self) -> None:
        self._pending = ""  # a possible partial marker, held until the next delta decides
        self._reasoning: list[str] = []
        self._content: list[str] = []
        self._finished = False

    def feed(self, text: str) -> ReasoningDelta:
        """Split one delta; only a trailing possible partial marker is held back."""
        if self._finished:
            raise RuntimeError("feed() after finish(): a reasoning parser serves one stream")
        buffer = self._pending + text
        pos = 0
        while (hit := first_marker(buffer, pos, self._markers())) is not None:
            at, marker = hit
            if at > pos:
                self._text(buffer[pos:at])
            pos = at + len(marker)
            self._marker(marker)
        end = len(buffer) - partial_marker_length(buffer, pos, self._markers())
        if end > pos:
            self._text(buffer[pos:end])
        self._pending = buffer[end:]
        return self._take()

    def finish(self) -> ReasoningDelta:
        """End of stream: the held partial marker is plain text after all. Idempotent."""
        if self._finished:
            return ReasoningDelta()
        self._finished = True
        held, self._pending = self._pending, ""
        if held:
            self._text(held)
        self._close()
        return self._take()

    def _emit_reasoning(self, text: str) -> None:
        self._reasoning.append(text)

    def _emit_content(self, text: str) -> None:
        self._content.append(text)

    def _take(self) -> ReasoningDelta:
        delta = ReasoningDelta("".join(self._reasoning), "".join(self._content))
        self._reasoning.clear()
        self._content.clear()
        return delta

    # Format hooks.

    def _markers(self) -> Sequence[str]:
        """Markers recognised in the current state (none contains another)."""
        raise NotImplementedError

    def _text(self, text: str) -> None:
        """Route plain text (never contains a marker of the current state)."""
        raise NotImplementedError

    def _marker(self, marker: str) -> None:
        """React to a complete marker of the current state."""
        raise NotImplementedError

    def _close(self) -> None:
        """Flush format state at the end of the stream (after the held text was routed)."""


class PassthroughParser(ReasoningParser):
    """No reasoning section: every delta is content, unchanged and unheld."""

    __slots__ = ()

    def _markers(self) -> Sequence[str]:
        return ()

    def _text(self, text: str) -> None:
        self._emit_content(text)

    def _marker(self, marker: str) -> None:  # pragma: no cover - there are no markers
        raise AssertionError(marker)


class ThinkTagParser(ReasoningParser):
    """Reasoning between a start and an end tag, e.g. `<think>...</think>`.

    In reasoning, the end tag switches to content and a repeated start tag is dropped; an
    optional `tool_start` (e.g. `<tool_call>`) also ends reasoning but is kept, in content, for
    the tool-call parser. In content, the start tag opens reasoning again and a stray end tag
    is dropped. `in_reasoning=True` starts in reasoning (the prompt opened the block).
    """

    __slots__ = ("_start", "_end", "_tool_start", "_in_reasoning", "_reasoning_markers",
                 "_content_markers")

    def __init__(self, start: str, end: str, *, in_reasoning: bool = False,
                 tool_start: str | None = None) -> None:
        super().__init__()
        self._start, self._end, self._tool_start = start, end, tool_start
        self._in_reasoning = in_reasoning
        self._reasoning_markers = (end, start) + ((tool_start,) if tool_start else ())
        self._content_markers = (start, end)
        _check_markers(self._reasoning_markers)

    def _markers(self) -> Sequence[str]:
        return self._reasoning_markers if self._in_reasoning else self._content_markers

    def _text(self, text: str) -> None:
        if self._in_reasoning:
            self._emit_reasoning(text)
        else:
            self._emit_content(text)

    def _marker(self, marker: str) -> None:
        if marker == self._start:
            self._in_reasoning = True
        elif marker == self._end:
            self._in_reasoning = False
        else:  # tool_start, only active in reasoning
            self._in_reasoning = False
            self._emit_content(marker)


class _Harmony(Enum):
    OUTSIDE = "outside"  # between messages
    HEADER = "header"  # after <|start|> or <|channel|>, before <|message|>
    BODY = "body"  # after <|message|>, before a terminator


class _Body(Enum):
    REASONING = "reasoning"
    CONTENT = "content"
    TOOL_CALL = "tool_call"


_START: Final = "<|start|>"
_CHANNEL: Final = "<|channel|>"
_MESSAGE: Final = "<|message|>"
_CONSTRAIN: Final = "<|constrain|>"
_END: Final = "<|end|>"
_CALL: Final = "<|call|>"
_RETURN: Final = "<|return|>"
_TERMINATORS: Final = (_END, _CALL, _RETURN)
_HARMONY_MARKERS: Final = (_START, _CHANNEL, _MESSAGE, _CONSTRAIN, *_TERMINATORS)
_HEADER_MARKERS: Final = (_MESSAGE, *_TERMINATORS)
# A recipient (`to=functions.get_weather`) may sit in the role or in the channel part.
_RECIPIENT: Final = re.compile(r"(?:^|(?<=\s)|(?<=\|>))to=")


class HarmonyParser(ReasoningParser):
    """gpt-oss harmony output: messages `<|start|>{header}<|message|>{body}<|end|>`.

    The first message usually lacks `<|start|>assistant` (the prompt ends with it), so a
    header also starts at `<|channel|>`. Headers are held until `<|message|>`, then:

    * `analysis` bodies are reasoning; `final` and `commentary` (preambles meant for the user)
      are content, as are bodies of unknown or missing channels;
    * a header with a recipient (`to=functions.x`, on any channel) is a tool call: header,
      body and its `<|call|>`/`<|end|>` pass through raw into content, for the harmony
      tool-call parser, as SGLang's `gpt-oss` detector does;
    * `<|start|>` or `<|channel|>` inside a body closes it implicitly (SGLang does the same);
    * every other marker is dropped; text between messages is content.

    A header still open at the end of the stream (cut by `max_tokens`) has no body and is
    dropped, as is a header that a terminator ends before `<|message|>`. The detokenizer must
    keep special tokens for this format, or there are no markers to see.
    """

    __slots__ = ("_state", "_body", "_header")

    def __init__(self) -> None:
        super().__init__()
        self._state = _Harmony.OUTSIDE
        self._body = _Body.CONTENT
        self._header = ""

    def _markers(self) -> Sequence[str]:
        return _HEADER_MARKERS if self._state is _Harmony.HEADER else _HARMONY_MARKERS

    def _text(self, text: str) -> None:
        if self._state is _Harmony.HEADER:
            self._header += text
        elif self._state is _Harmony.BODY and self._body is _Body.REASONING:
            self._emit_reasoning(text)
        else:
            self._emit_content(text)

    def _marker(self, marker: str) -> None:
        if self._state is _Harmony.HEADER:
            if marker == _MESSAGE:
                self._open_body(self._header)
            else:  # a terminator before any body: nothing to show
                self._state = _Harmony.OUTSIDE
            self._header = ""
            return
        if self._state is _Harmony.BODY:
            raw = self._body is _Body.TOOL_CALL
            if marker in (_START, _CHANNEL):
                self._state = _Harmony.OUTSIDE  # implicit close, then open the next header
            else:
                if raw:
                    self._emit_content(marker)
                if marker in _TERMINATORS:
                    self._state = _Harmony.OUTSIDE
                return
        if marker in (_START, _CHANNEL):
            self._state, self._header = _Harmony.HEADER, marker
        elif marker == _MESSAGE:  # a body without a header
            self._state, self._body = _Harmony.BODY, _Body.CONTENT
        # Stray <|constrain|> or terminators between messages are dropped.

    def _open_body(self, header: str) -> None:
        self._state = _Harmony.BODY
        self._body = _classify_header(header)
        if self._body is _Body.TOOL_CALL:
            self._emit_content(header + _MESSAGE)

    def _close(self) -> None:
        self._header = ""


def _classify_header(header: str) -> _Body:
    """What a message's body is, from its raw header (`<|start|>` or `<|channel|>` onwards)."""
    if _RECIPIENT.search(header):
        return _Body.TOOL_CALL
    _, has_channel, channel = header.rpartition(_CHANNEL)
    words = channel.partition(_CONSTRAIN)[0].split() if has_channel else []
    return _Body.REASONING if words and words[0] == "analysis" else _Body.CONTENT


def _check_markers(markers: Sequence[str]) -> None:
    """Reject marker sets where one marker contains another: the earliest complete match would
    then depend on where the deltas are cut."""
    for i, marker in enumerate(markers):
        if not marker:
            raise ValueError("empty reasoning marker")
        for other in markers[i + 1:]:
            if other in marker or marker in other:
                raise ValueError(f"reasoning markers {marker!r} and {other!r} overlap")


_check_markers(_HARMONY_MARKERS)




_THINK: Final = "<think>"
_END_THINK: Final = "</think>"
_TOOL_CALL: Final = "<tool_call>"

# Every accepted name (after lower-casing and `-` -> `_`) to its format: the canonical names
# plus the spellings of SGLang (`--reasoning-parser`), smg and Dynamo for the same format.
KNOWN_REASONING_PARSERS: Final = MappingProxyType({
    "basic": "basic",
    "base": "basic",  # smg
    "deepseek_r1": "deepseek_r1",  # SGLang spells it deepseek-r1
    "qwen3": "qwen3",
    "qwen3_thinking": "qwen3_thinking",  # SGLang qwen3-thinking
    "kimi": "kimi",
    "glm45": "glm45",
    "step3": "step3",
    "step3p5": "step3",  # SGLang
    "gpt_oss": "gpt_oss",  # SGLang gpt-oss
    "passthrough": "passthrough",  # smg
})


def reasoning_parser(name: str, *, enable_thinking: bool | None = None,
                     force_reasoning: bool = False) -> ReasoningParser:
    """A fresh parser for one choice of one request (parsers hold per-stream state).

    `enable_thinking` is the request's `chat_template_kwargs` switch; only `qwen3` and `glm45`
    read it (`False`: no reasoning section; otherwise reasoning begins at the model's `<think>`). `force_reasoning=True` says the
    rendered prompt already opened the reasoning block, so output starts in reasoning for every
    tag format. Both are ignored by `gpt_oss` and `passthrough`.
    """
    key = name.strip().lower().replace("-", "_")
    kind = KNOWN_REASONING_PARSERS.get(key)
    if kind is None:
        known = ", ".join(sorted(KNOWN_REASONING_PARSERS))
        raise UnknownReasoningParser(f"unknown reasoning parser {name!r}; known: {known}")
    if kind == "gpt_oss":
        return HarmonyParser()
    if kind == "passthrough":
        return PassthroughParser()
    if kind == "kimi":
        return ThinkTagParser("◁think▷", "◁/think▷", in_reasoning=force_reasoning)
    if kind == "basic":
        return ThinkTagParser(_THINK, _END_THINK, in_reasoning=force_reasoning)
    if kind in ("deepseek_r1", "step3"):
        return ThinkTagParser(_THINK, _END_THINK, in_reasoning=True)
    # qwen3, glm45: the model opens `<think>` itself (as smg's parsers expect), so output without
    # tags stays content, thinking on or off (`enable_thinking=False` just means no tags come).
    # qwen3_thinking models' templates open the block in the prompt: output starts in reasoning.
    thinking = force_reasoning or kind == "qwen3_thinking"
    return ThinkTagParser(_THINK, _END_THINK, in_reasoning=thinking, tool_start=_TOOL_CALL)
