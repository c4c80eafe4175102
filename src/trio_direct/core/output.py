"""One choice's output, sans-IO: engine chunks in, `ChoiceEvent`s out, usage kept.

The pipeline per choice is fixed by planning: the incremental detokenizer, then stop strings, then
the reasoning parser, then the tool-call parser. Every API surface renders the same events; none
re-parses text. `ChoiceResult` collects a choice's events for a unary answer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from trio_direct.engine.types import GenerateChunk, TokenLogprob
from trio_direct.parsers.reasoning import ReasoningDelta
from trio_direct.parsers.tools import ToolCall, ToolCallDelta, ToolDelta, ToolParser, assemble

__all__ = [
    "ChoiceEvent",
    "ChoiceOutput",
    "ChoiceResult",
    "ReasoningSplitter",
    "StopMatcher",
    "TextDecoder",
    "merge_events",
]


class TextDecoder(Protocol):
    """Token ids to text, incrementally (`text.detokenizer.IncrementalDetokenizer`)."""

    def prepare(self) -> None: ...

    def push(self, token_ids: list[int]) -> str: ...

    def flush(self) -> str: ...


class StopMatcher(Protocol):
    """Cuts text at the request's stop strings (`text.stop_strings.StopStringMatcher`)."""

    def push(self, text: str) -> tuple[str, str | None]: ...

    def flush(self) -> str: ...


class ReasoningSplitter(Protocol):
    """Splits reasoning from content (`parsers.reasoning`)."""

    @property
    def requires_special_tokens(self) -> bool: ...

    def feed(self, text: str) -> ReasoningDelta: ...

    def finish(self) -> ReasoningDelta: ...


@dataclass(slots=True)
class ChoiceEvent:
    """New output of one choice: text (already cut at stop strings) and, at its end, why it ended."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    matched_stop: int | str | None = None
    abort_message: str | None = None
    logprobs: list[TokenLogprob] | None = None
    #: The prompt's logprob rows (completions `echo` with `logprobs`), on the event that brought them.
    prompt_logprobs: list[TokenLogprob] | None = None
    #: Text of the model's reasoning section, already taken out of `text`.
    reasoning: str = ""
    #: Tool-call deltas, already taken out of `text`.
    tool_calls: list[ToolCallDelta] = field(default_factory=list)


@dataclass(slots=True)
class ChoiceOutput:
    """Sans-IO text state of one choice, and its usage as the engine reported it."""

    index: int
    decoder: TextDecoder
    stops: StopMatcher | None = None
    reasoning_parser: ReasoningSplitter | None = None
    tool_parser: ToolParser | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0
    finish_reason: str | None = None
    #: Disaggregated serving: the prefill leg's cache hit (the decode leg reports the whole prompt).
    prompt_cached_tokens: int | None = None
    #: Every token id generated so far, over all engine calls: a migrated stream continues from them.
    generated: list[int] = field(default_factory=list)
    #: The ids the engine stops on (EOS ids included unless `ignore_eos`): none of them ends up in text.
    stop_token_ids: frozenset[int] = frozenset()
    #: Reasoning tokens generated before the current engine call, whose own count starts again from
    #: 0; and whether the call is a continuation (its prompt and cache counts are then its own, not
    #: the client's: the first call's stay).
    _reasoning_base: int = field(default=0, init=False, repr=False)
    _continued: bool = field(default=False, init=False, repr=False)
    #: A stop token that ended the last push without a finish: whether it ends the stream comes in a
    #: later message (vLLM sends the delta that carries it, then a `complete`; the two can arrive in
    #: separate reads), so it is not text until then.
    _held: list[int] = field(default_factory=list, init=False, repr=False)

    @property
    def usage_cached_tokens(self) -> int:
        return self.cached_tokens if self.prompt_cached_tokens is None else self.prompt_cached_tokens

    def prepare(self) -> None:
        """Set up what only the output needs; called once the engine call is on its way."""
        self.decoder.prepare()

    def continue_elsewhere(self) -> list[int]:
        """The stream moves to another engine (migration): the generated ids, which the next call's
        prompt repeats. Text state (detokenizer, stop strings, parsers) carries on untouched: the
        next call's tokens read as the rest of one stream."""
        self._reasoning_base = self.reasoning_tokens
        self._continued = True
        return self.generated

    def push(self, batch: list[GenerateChunk]) -> ChoiceEvent:
        token_ids = [token for chunk in batch for token in chunk.token_ids]
        self.generated += token_ids
        last = batch[-1]
        text_ids, self._held = self._held + token_ids, []
        if last.finish_reason is None:
            if text_ids and text_ids[-1] in self.stop_token_ids:
                text_ids, self._held = text_ids[:-1], text_ids[-1:]
        elif last.finish_reason == "stop" and text_ids:
            ending = text_ids[-1]
            if ending in self.stop_token_ids or ending == last.matched_stop:
                text_ids = text_ids[:-1]  # the stop token (EOS) ends the text, it is not part of it
        if self._continued:
            # The engine counts from the continuation's start; its prompt and cache hit are not the client's.
            self.completion_tokens = len(self.generated)
            if last.reasoning_tokens:
                self.reasoning_tokens = self._reasoning_base + last.reasoning_tokens
        else:
            self.prompt_tokens = last.prompt_tokens or self.prompt_tokens
            self.completion_tokens = last.completion_tokens or self.completion_tokens + len(token_ids)
            self.cached_tokens = last.cached_tokens or self.cached_tokens
            self.reasoning_tokens = last.reasoning_tokens or self.reasoning_tokens
        text = self.decoder.push(text_ids)
        finish = last.finish_reason
        if finish is not None:
            text += self.decoder.flush()
        event = ChoiceEvent(self.index, text, token_ids, finish, last.matched_stop, last.abort_message)
        if any(chunk.logprobs is not None for chunk in batch):
            event.logprobs = [row for chunk in batch for row in chunk.logprobs or ()]
        event.prompt_logprobs = next((c.prompt_logprobs for c in batch if c.prompt_logprobs is not None), None)
        if self.stops is not None:
            event.text, matched = self.stops.push(text)
            if matched is not None:
                event.finish_reason, event.matched_stop = "stop", matched
            elif finish is not None:
                event.text += self.stops.flush()
        if self.reasoning_parser is not None:
            split = self.reasoning_parser.feed(event.text)
            if event.finish_reason is not None:
                rest = self.reasoning_parser.finish()
                split = ReasoningDelta(split.reasoning + rest.reasoning, split.content + rest.content)
            event.reasoning, event.text = split.reasoning, split.content
        if self.tool_parser is not None:
            tools = self.tool_parser.feed(event.text)
            if event.finish_reason is not None:
                tail = self.tool_parser.finish()
                tools = ToolDelta(tools.content + tail.content, tools.calls + tail.calls)
                if self.tool_parser.call_count and event.finish_reason == "stop":
                    event.finish_reason = "tool_calls"
            event.text, event.tool_calls = tools.content, tools.calls
        self.finish_reason = event.finish_reason
        return event


def merge_events(batch: list[ChoiceEvent]) -> list[ChoiceEvent]:
    """One event per choice: the texts of a choice's events concatenated, its last finish kept."""
    if len(batch) == 1:
        return batch
    merged: dict[int, ChoiceEvent] = {}
    for event in batch:
        seen = merged.get(event.index)
        if seen is None:
            merged[event.index] = event
        else:
            seen.text += event.text
            seen.reasoning += event.reasoning
            seen.tool_calls += event.tool_calls
            seen.token_ids += event.token_ids
            seen.finish_reason, seen.matched_stop, seen.abort_message = (
                event.finish_reason, event.matched_stop, event.abort_message
            )  # fmt: skip
            if event.logprobs is not None:
                seen.logprobs = (seen.logprobs or []) + event.logprobs
            if seen.prompt_logprobs is None:
                seen.prompt_logprobs = event.prompt_logprobs
    return list(merged.values())


@dataclass(slots=True)
class ChoiceResult:
    """Everything one choice produced, for a unary answer."""

    index: int
    text_parts: list[str] = field(default_factory=list)
    reasoning_parts: list[str] = field(default_factory=list)
    call_deltas: list[ToolCallDelta] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    matched_stop: int | str | None = None
    prompt_logprobs: list[TokenLogprob] | None = None

    def add(self, event: ChoiceEvent) -> None:
        if self.prompt_logprobs is None:
            self.prompt_logprobs = event.prompt_logprobs
        self.text_parts.append(event.text)
        self.token_ids += event.token_ids
        self.reasoning_parts.append(event.reasoning)
        self.call_deltas += event.tool_calls
        self.logprobs += event.logprobs or ()
        if event.finish_reason is not None:
            self.finish_reason = event.finish_reason
            self.matched_stop = event.matched_stop

    @property
    def text(self) -> str:
        return "".join(self.text_parts)

    @property
    def reasoning(self) -> str:
        return "".join(self.reasoning_parts)

    def tool_calls(self) -> list[ToolCall]:
        """The finished calls, their argument pieces joined."""
        if not self.call_deltas:
            return []
        _, finished = assemble([ToolDelta("", self.call_deltas)])
        return finished
