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

Formats (names as SGLang, smg, vLLM and Dynamo spell them are aliases, see
`KNOWN_REASONING_PARSERS`; `REASONING_FORMATS` says each one's markup):

* think-tag formats (`ThinkTagParser`): a start and an end tag, e.g. `<think>...</think>`,
  `[THINK]...[/THINK]`, `<|START_THINKING|>...<|END_THINKING|>`, Kimi K3's XTML think channel.
  Some start in reasoning (the template opened the block: `deepseek_r1`, `step3`, `minimax`,
  `qwen3_thinking`, `kimi_thinking`, `cohere_command4`), the others only at the model's start tag
  or when the prompt ends with it. A format's *tool start* (`<tool_call>`, Kimi's section token)
  inside reasoning ends it and stays in content for the tool-call parser (models open calls
  without closing the block); framing tokens around the answer (Cohere's `<|START_TEXT|>`, K3's
  `response` channel) are dropped.
* `gpt_oss`: harmony channels, see `HarmonyParser`.
* `inkling`: typed TML blocks, see `InklingBlocksParser`.
* `minimax_append_think`: no split; the answer gets back the `<think>` its template consumed.
* `passthrough`: everything is content.

Deliberate differences from SGLang's detectors (whose streaming and one-shot results disagree
with each other on these inputs): a second `<think>` after `</think>` opens another reasoning
section instead of leaking into content; a stray `</think>` in content and a repeated `<think>`
inside reasoning are dropped instead of shown; text before a mid-stream `<think>` stays content.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from types import MappingProxyType
from typing import Final

from trio_direct.parsers.markers import first_marker, partial_marker_length

__all__ = [
    "INKLING_CONTROL_TOKENS",
    "KNOWN_REASONING_PARSERS",
    "REASONING_FORMATS",
    "Gemma4ThoughtParser",
    "HarmonyParser",
    "InklingBlocksParser",
    "PassthroughParser",
    "PrefixedContentParser",
    "ReasoningDelta",
    "ReasoningFormat",
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
    `requires_special_tokens` tells the caller that the detokenizer must keep special tokens:
    the format's markers are special tokens (harmony's, Cohere's, ...), or there is nothing to see.
    """

    __slots__ = ("_content", "_finished", "_pending", "_reasoning", "requires_special_tokens")

    def __init__(self, *, requires_special_tokens: bool = False) -> None:
        self.requires_special_tokens = requires_special_tokens
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

    In reasoning, the end tag (or one of `extra_ends`) switches to content and a repeated start
    tag is dropped; a *tool start* (`tool_start`, `tool_starts`: e.g. `<tool_call>`) also ends
    reasoning but is kept, in content, for the tool-call parser. In content, the start tag opens
    reasoning again, and a stray end tag and the `content_drops` (answer framing) are dropped.
    `in_reasoning=True` starts in reasoning (the prompt opened the block).
    """

    __slots__ = (
        "_content_markers",
        "_ends",
        "_in_reasoning",
        "_reasoning_markers",
        "_start",
        "_tool_starts",
    )

    def __init__(
        self,
        start: str,
        end: str,
        *,
        in_reasoning: bool = False,
        tool_start: str | None = None,
        tool_starts: Sequence[str] = (),
        extra_ends: Sequence[str] = (),
        content_drops: Sequence[str] = (),
        requires_special_tokens: bool = False,
    ) -> None:
        super().__init__(requires_special_tokens=requires_special_tokens)
        self._start = start
        self._ends = (end, *extra_ends)
        self._tool_starts = (*((tool_start,) if tool_start else ()), *tool_starts)
        self._in_reasoning = in_reasoning
        self._reasoning_markers = (*self._ends, start, *self._tool_starts)
        self._content_markers = tuple(dict.fromkeys((start, end, *content_drops)))
        _check_markers(self._reasoning_markers)
        _check_markers(self._content_markers)

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
        elif not self._in_reasoning:
            pass  # a stray end tag or answer framing: not text
        elif marker in self._ends:
            self._in_reasoning = False
        else:  # a tool start, only active in reasoning
            self._in_reasoning = False
            self._emit_content(marker)


class Gemma4ThoughtParser(ThinkTagParser):
    """Gemma 4: reasoning between `<|channel>` and `<channel|>`, opened by a `thought\\n` role
    label that is not reasoning (smg's `gemma4` parser strips it too).

    The label is held while the reasoning so far could still be it, so every chunking agrees;
    reasoning that is not the label is released as soon as it diverges, or when the block ends.
    """

    __slots__ = ("_label", "_label_done")

    def __init__(self, *, in_reasoning: bool = False) -> None:
        super().__init__(_GEMMA4_START, _GEMMA4_END, in_reasoning=in_reasoning, requires_special_tokens=True)
        self._label = ""
        self._label_done = False

    def _text(self, text: str) -> None:
        if not self._in_reasoning or self._label_done:
            super()._text(text)
            return
        self._label += text
        if self._label.startswith(_GEMMA4_LABEL):
            rest = self._label[len(_GEMMA4_LABEL) :]
            self._label, self._label_done = "", True
            if rest:
                self._emit_reasoning(rest)
        elif not _GEMMA4_LABEL.startswith(self._label):
            held, self._label, self._label_done = self._label, "", True
            self._emit_reasoning(held)

    def _marker(self, marker: str) -> None:
        self._release_label()
        was_reasoning = self._in_reasoning
        super()._marker(marker)
        if self._in_reasoning and not was_reasoning:
            self._label_done = False  # a new block: its own label

    def _close(self) -> None:
        self._release_label()

    def _release_label(self) -> None:
        if self._label:
            held, self._label = self._label, ""
            self._emit_reasoning(held)
        self._label_done = True


class PrefixedContentParser(ReasoningParser):
    """No split: everything is content, after `prefix` (MiniMax's `minimax-append-think` gives the
    answer back the `<think>` its template put in the prompt, for clients that split it themselves).

    The prefix goes out with the first text, or at the end when there was none, as SGLang's
    parser does for a whole response.
    """

    __slots__ = ("_prefix",)

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self._prefix = prefix

    def _markers(self) -> Sequence[str]:
        return ()

    def _text(self, text: str) -> None:
        self._emit_content(self._prefix + text)
        self._prefix = ""

    def _marker(self, marker: str) -> None:  # pragma: no cover - there are no markers
        raise AssertionError(marker)

    def _close(self) -> None:
        if self._prefix:
            self._emit_content(self._prefix)
            self._prefix = ""


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
    dropped, as is a header that a terminator ends before `<|message|>`. The markers are plain
    strings here: special-token text and text from a tokenizer without the tokens read alike.
    """

    __slots__ = ("_body", "_header", "_state")

    def __init__(self) -> None:
        super().__init__(requires_special_tokens=True)
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
        for other in markers[i + 1 :]:
            if other in marker or marker in other:
                raise ValueError(f"reasoning markers {marker!r} and {other!r} overlap")


_check_markers(_HARMONY_MARKERS)


class _Block(Enum):
    NONE = "none"  # between blocks
    HEADER = "header"  # after <|message_model|>, before its content type
    REASONING = "reasoning"
    CONTENT = "content"
    TOOL = "tool"


_MESSAGE_MODEL: Final = "<|message_model|>"
_CONTENT_THINKING: Final = "<|content_thinking|>"
_CONTENT_TEXT: Final = "<|content_text|>"
_INVOKE_JSON: Final = "<|content_invoke_tool_json|>"
_INVOKE_TEXT: Final = "<|content_invoke_tool_text|>"
_BLOCK_ENDS: Final = ("<|end_message|>", "<|content_model_end_sampling|>")
# The TML tokenizer's control tokens (all of them are recognised, so none leaks into text).
INKLING_CONTROL_TOKENS: Final = (
    "<|endoftext|>",
    "<|message_user|>",
    _MESSAGE_MODEL,
    "<|message_system|>",
    "<|message_tool|>",
    _CONTENT_TEXT,
    "<|content_image|>",
    _CONTENT_THINKING,
    "<|content_audio_input|>",
    "<|content_tool_error|>",
    "<|content_xml|>",
    _INVOKE_JSON,
    _INVOKE_TEXT,
    *_BLOCK_ENDS,
    "<|audio_end|>",
)
_check_markers(INKLING_CONTROL_TOKENS)


class InklingBlocksParser(ReasoningParser):
    """Inkling's typed TML blocks: `<|message_model|><|content_thinking|>...<|end_message|>`
    is reasoning, `<|content_text|>` blocks are content.

    Tool-invocation blocks (`<|content_invoke_tool_json|>` / `_text|>`) pass through raw, with
    their header, for the inkling tool-call parser. Headers (the author between
    `<|message_model|>` and the content type) and other control tokens are dropped; a
    `<|message_model|>` inside an open block is the model quoting the protocol and stays text,
    as in SGLang's parser. Text outside any block is content.
    """

    __slots__ = ("_block", "_header")

    def __init__(self, *, in_reasoning: bool = False) -> None:
        super().__init__(requires_special_tokens=True)
        self._block = _Block.REASONING if in_reasoning else _Block.NONE
        self._header = ""

    def _markers(self) -> Sequence[str]:
        return INKLING_CONTROL_TOKENS

    def _text(self, text: str) -> None:
        if self._block is _Block.HEADER:
            self._header += text
        elif self._block is _Block.REASONING:
            self._emit_reasoning(text)
        else:
            self._emit_content(text)

    def _marker(self, marker: str) -> None:
        block = self._block
        if marker == _MESSAGE_MODEL:
            if block in (_Block.NONE, _Block.HEADER):
                self._block, self._header = _Block.HEADER, ""
            else:
                self._text(marker)
        elif marker in (_INVOKE_JSON, _INVOKE_TEXT):
            if block is _Block.HEADER:
                self._emit_content(_MESSAGE_MODEL + self._header)
            self._emit_content(marker)
            self._block, self._header = _Block.TOOL, ""
        elif block is _Block.TOOL:
            self._emit_content(marker)
            if marker in _BLOCK_ENDS:
                self._block = _Block.NONE
        elif marker == _CONTENT_THINKING:
            self._block, self._header = _Block.REASONING, ""
        elif marker == _CONTENT_TEXT:
            self._block, self._header = _Block.CONTENT, ""
        elif marker in _BLOCK_ENDS:
            self._block, self._header = _Block.NONE, ""
        # Other control tokens are framing: dropped.

    def _close(self) -> None:
        self._header = ""  # a header cut off before its content type shows nothing


_THINK: Final = "<think>"
_END_THINK: Final = "</think>"
_TOOL_CALL: Final = "<tool_call>"
_KIMI_SECTION: Final = "<|tool_calls_section_begin|>"
_COHERE_TEXT: Final = ("<|START_TEXT|>", "<|END_TEXT|>", "<|START_RESPONSE|>", "<|END_RESPONSE|>")
_K3_RESPONSE: Final = ("<|open|>response<|sep|>", "<|open|>message<|sep|>")
_K3_FRAMING: Final = (*_K3_RESPONSE, "<|close|>response<|sep|>", "<|close|>message<|sep|>")
_GEMMA4_START: Final = "<|channel>"
_GEMMA4_END: Final = "<channel|>"
_GEMMA4_LABEL: Final = "thought\n"
_MINIMAX_SEPARATOR: Final = "]<]minimax[>["


@dataclass(frozen=True, slots=True)
class ReasoningFormat:
    """A think-tag format: its markup, and whether the output starts inside reasoning."""

    start: str
    end: str
    starts_in_reasoning: bool = False  # the chat template always opens the block
    tool_starts: tuple[str, ...] = ()
    extra_ends: tuple[str, ...] = ()
    content_drops: tuple[str, ...] = ()
    requires_special_tokens: bool = False


# The think-tag formats by canonical name (`gpt_oss`, `inkling`, `minimax_append_think` and
# `passthrough` have their own parsers).
REASONING_FORMATS: Final[Mapping[str, ReasoningFormat]] = MappingProxyType(
    {
        "basic": ReasoningFormat(_THINK, _END_THINK),
        "deepseek_r1": ReasoningFormat(_THINK, _END_THINK, starts_in_reasoning=True),
        "step3": ReasoningFormat(_THINK, _END_THINK, starts_in_reasoning=True),
        "qwen3": ReasoningFormat(_THINK, _END_THINK, tool_starts=(_TOOL_CALL,)),
        "qwen3_thinking": ReasoningFormat(_THINK, _END_THINK, starts_in_reasoning=True, tool_starts=(_TOOL_CALL,)),
        "glm45": ReasoningFormat(_THINK, _END_THINK, tool_starts=(_TOOL_CALL,)),
        "nano_v3": ReasoningFormat(_THINK, _END_THINK, tool_starts=(_TOOL_CALL,)),
        "deepseek_v31": ReasoningFormat(_THINK, _END_THINK),
        "deepseek_v4": ReasoningFormat(_THINK, _END_THINK),
        "kimi": ReasoningFormat("\u25c1think\u25b7", "\u25c1/think\u25b7"),
        "kimi_k25": ReasoningFormat(_THINK, _END_THINK, tool_starts=(_KIMI_SECTION,)),
        "kimi_thinking": ReasoningFormat(_THINK, _END_THINK, starts_in_reasoning=True, tool_starts=(_KIMI_SECTION,)),
        "kimi_k3": ReasoningFormat(
            "<|open|>think<|sep|>",
            "<|close|>think<|sep|>",
            tool_starts=("<|open|>tools<|sep|>",),
            extra_ends=_K3_RESPONSE,
            content_drops=_K3_FRAMING,
            requires_special_tokens=True,
        ),
        "minimax": ReasoningFormat(_THINK, _END_THINK, starts_in_reasoning=True, tool_starts=("<minimax:tool_call>",)),
        "cohere_cmd": ReasoningFormat(
            "<|START_THINKING|>",
            "<|END_THINKING|>",
            tool_starts=("<|START_ACTION|>",),
            extra_ends=_COHERE_TEXT[::2],
            content_drops=_COHERE_TEXT,
            requires_special_tokens=True,
        ),
        "cohere_command4": ReasoningFormat(
            "<|START_THINKING|>",
            "<|END_THINKING|>",
            starts_in_reasoning=True,
            tool_starts=("<|START_ACTION|>",),
            extra_ends=_COHERE_TEXT[::2],
            content_drops=_COHERE_TEXT,
            requires_special_tokens=True,
        ),
        "mistral": ReasoningFormat("[THINK]", "[/THINK]", requires_special_tokens=True),
        "hunyuan": ReasoningFormat(_THINK, _END_THINK, tool_starts=("<tool_calls>",)),
        "seed_oss": ReasoningFormat(
            "<seed:think>", "</seed:think>", tool_starts=("<seed:tool_call>",), requires_special_tokens=True
        ),
        "hy4": ReasoningFormat(
            "<think:opensource>",
            "</think:opensource>",
            tool_starts=("<tool_calls:opensource>",),
            requires_special_tokens=True,
        ),
        "deepseek_v41": ReasoningFormat(_THINK, _END_THINK, tool_starts=("<\uff5cDSML\uff5c calls>",)),
        "minimax_m3": ReasoningFormat(
            "<mm:think>",
            "</mm:think>",
            tool_starts=(_TOOL_CALL,),
            content_drops=(_MINIMAX_SEPARATOR,),
            requires_special_tokens=True,
        ),
        "gemma4": ReasoningFormat(_GEMMA4_START, _GEMMA4_END, requires_special_tokens=True),
    }
)

# Every accepted name (after lower-casing and `-` -> `_`) to its format: the canonical names
# plus the spellings of SGLang (`--reasoning-parser`), smg, vLLM and Dynamo for the same format.
KNOWN_REASONING_PARSERS: Final = MappingProxyType(
    {
        "basic": "basic",  # Dynamo
        "base": "basic",  # smg
        "passthrough": "passthrough",  # smg
        "deepseek_r1": "deepseek_r1",  # everyone; SGLang spells it deepseek-r1
        "qwen3": "qwen3",
        "interns1": "qwen3",  # SGLang: same tags
        "mimo": "qwen3",  # SGLang: same tags
        "poolside_v1": "qwen3",  # SGLang: same tags
        "telechat4": "qwen3",  # SGLang: same tags
        "qwen3_thinking": "qwen3_thinking",  # smg; SGLang qwen3-thinking
        "glm45": "glm45",
        "nano_v3": "nano_v3",  # smg
        "nemotron_3": "nano_v3",  # SGLang
        "nemotron3": "nano_v3",  # Dynamo
        "nemotron_nano": "nano_v3",  # Dynamo
        "step3": "step3",
        "step3p5": "step3",  # SGLang
        "kimi": "kimi",
        "kimi_k25": "kimi_k25",  # smg, Dynamo
        "kimi_k2": "kimi_k25",  # SGLang: the same tags and section token
        "kimi_thinking": "kimi_thinking",  # smg
        "kimi_k3": "kimi_k3",  # smg, SGLang
        "deepseek_v31": "deepseek_v31",  # smg
        "deepseek_v3": "deepseek_v31",  # SGLang deepseek-v3
        "deepseek_v4": "deepseek_v4",  # smg, Dynamo; SGLang deepseek-v4
        "minimax": "minimax",  # smg, SGLang
        "minimax_append_think": "minimax_append_think",  # Dynamo; SGLang minimax-append-think
        "cohere_cmd": "cohere_cmd",  # smg
        "cohere_command4": "cohere_command4",  # SGLang
        "inkling": "inkling",  # smg, SGLang
        "mistral": "mistral",  # SGLang, Dynamo, vLLM
        "hunyuan": "hunyuan",  # SGLang
        "seed_oss": "seed_oss",  # vLLM
        "gpt_oss": "gpt_oss",  # SGLang gpt-oss, Dynamo
        # smg 1.13's Symphony table names (a table reads both; here its reasoning markup), and
        # its newer legacy parsers. `plain`, `json`, `xlam`, `qwen2.5`, `olmo3` and
        # `function_gemma` templates have no thought: no split.
        "qwen3_tagged": "qwen3",  # smg table: Qwen3's tags, Qwen3-Coder's call syntax
        "qwen3_tagged_direct": "qwen3",  # smg table
        "qwen2.5": "passthrough",  # smg table: `<think>` is text
        "plain": "passthrough",  # smg table
        "json": "passthrough",  # smg table
        "xlam": "passthrough",  # smg table
        "olmo3": "passthrough",  # smg table
        "function_gemma": "passthrough",  # smg table
        "glm": "glm45",  # smg table (GLM 4.7 and later; the prompt opens the thought)
        "glm4": "glm45",  # smg table
        "ling": "glm45",  # smg table: `<think>` opened by the prompt, GLM's call tags
        "iquest": "glm45",  # smg table: `<think>` opened by the prompt
        "lfm2.5": "basic",  # smg table: the model writes its own `<think>`
        "llama_nemotron": "basic",  # smg table
        "minimax_m2": "minimax",  # smg table
        "mistral_v13": "mistral",  # smg table: `[THINK]…[/THINK]`
        "hy4": "hy4",  # smg table
        "hy_v4": "hy4",  # smg
        "deepseek_v41": "deepseek_v41",  # smg
        "deepseek_v4.1": "deepseek_v41",  # smg table
        "minimax_m3": "minimax_m3",  # smg (parser and table)
        "gemma4": "gemma4",  # smg (parser and table)
    }
)


def reasoning_parser(
    name: str, *, enable_thinking: bool | None = None, force_reasoning: bool = False, prompt: str | None = None
) -> ReasoningParser:
    """A fresh parser for one choice of one request (parsers hold per-stream state).

    The output starts in reasoning when the format always does, when `force_reasoning` says the
    rendered prompt opened the block, or when `prompt` (the rendered prompt's text) ends with the
    format's own start tag. `enable_thinking` is the request's `chat_template_kwargs` switch; it is
    accepted for the record but changes nothing: with thinking off the template writes no open
    block and the model no start tag, which the parser sees by itself. Ignored by `gpt_oss` and
    `passthrough`.
    """
    del enable_thinking
    key = name.strip().lower().replace("-", "_")
    kind = KNOWN_REASONING_PARSERS.get(key)
    if kind is None:
        known = ", ".join(sorted(KNOWN_REASONING_PARSERS))
        raise UnknownReasoningParser(f"unknown reasoning parser {name!r}; known: {known}")
    if kind == "gpt_oss":
        return HarmonyParser()
    if kind == "passthrough":
        return PassthroughParser()
    if kind == "minimax_append_think":
        return PrefixedContentParser(_THINK)
    opened = prompt is not None and _ends_with_open_block(prompt, kind)
    if kind == "inkling":
        return InklingBlocksParser(in_reasoning=force_reasoning or opened)
    if kind == "gemma4":
        return Gemma4ThoughtParser(in_reasoning=force_reasoning or opened)
    spec = REASONING_FORMATS[kind]
    return ThinkTagParser(
        spec.start,
        spec.end,
        in_reasoning=spec.starts_in_reasoning or force_reasoning or opened,
        tool_starts=spec.tool_starts,
        extra_ends=spec.extra_ends,
        content_drops=spec.content_drops,
        requires_special_tokens=spec.requires_special_tokens,
    )


def _ends_with_open_block(prompt: str, kind: str) -> bool:
    """The rendered prompt ends inside a reasoning block of format `kind`."""
    tail = prompt.rstrip()
    if kind == "inkling":
        return tail.endswith(_CONTENT_THINKING)
    spec = REASONING_FORMATS[kind]
    return tail.endswith(spec.start)
